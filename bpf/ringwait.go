package bpf

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ringWaiter waits for a ring buffer map to have records, in Go's network poller: the
// waiting goroutine parks instead of blocking its thread in a system call.
type ringWaiter struct {
	f           *os.File // a duplicate of the map's descriptor, non-blocking
	rc          syscall.RawConn
	interrupted atomic.Bool
}

func newRingWaiter(mapFD int) (*ringWaiter, error) {
	fd, err := unix.FcntlInt(uintptr(mapFD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicate ring buffer descriptor: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ring buffer descriptor non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(fd), "ringbuf")
	w := &ringWaiter{f: f}
	// A descriptor the poller did not take has no deadlines.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("ring buffer in the poller: %w", err)
	}
	if w.rc, err = f.SyscallConn(); err != nil {
		f.Close()
		return nil, err
	}
	return w, nil
}

// wait returns when the kernel signals the ring, when d has passed, or at interrupt.
func (w *ringWaiter) wait(d time.Duration) error {
	if err := w.f.SetReadDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	if w.interrupted.Load() { // before the deadline above replaced interrupt's
		return nil
	}
	asked := false
	err := w.rc.Read(func(uintptr) bool {
		// The first call comes before any wait: say not ready, to be called again
		// once the poller reports the descriptor readable.
		done := asked
		asked = true
		return done
	})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil
	}
	return err
}

// interrupt ends the wait under way and makes later ones return at once.
func (w *ringWaiter) interrupt() {
	w.interrupted.Store(true)
	_ = w.f.SetReadDeadline(time.Now())
}

func (w *ringWaiter) close() { w.f.Close() }
