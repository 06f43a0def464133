package objfile

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrStalled: opening a file did not finish in OpenTimeout. A FUSE daemon that never
// answers a lookup blocks the path walk itself, before the file could be recognised and
// refused; the open is abandoned, and files on the same device are not tried again.
var ErrStalled = errors.New("opening the file stalled")

// OpenTimeout bounds how long opening one file may take.
var OpenTimeout = 2 * time.Second

// maxStalled bounds the opens abandoned at once: each holds a thread in the kernel.
const maxStalled = 8

var stalls struct {
	sync.Mutex
	devices map[uint64]bool
	running int // abandoned opens still blocked
}

// bounded runs open, giving up after OpenTimeout. dev is the device the file is on, when
// known (0 otherwise): once an open there stalls, later ones fail at once.
func bounded(dev uint64, open func() (*Handle, error)) (*Handle, error) {
	stalls.Lock()
	if dev != 0 && stalls.devices[dev] {
		stalls.Unlock()
		return nil, fmt.Errorf("%w earlier on device %#x", ErrStalled, dev)
	}
	if stalls.running >= maxStalled {
		stalls.Unlock()
		return nil, fmt.Errorf("%w: %d opens are still blocked", ErrStalled, maxStalled)
	}
	stalls.Unlock()
	type result struct {
		h   *Handle
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := open()
		done <- result{h, err}
	}()
	timer := time.NewTimer(OpenTimeout)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.h, r.err
	case <-timer.C:
	}
	stalls.Lock()
	if dev != 0 {
		if stalls.devices == nil {
			stalls.devices = map[uint64]bool{}
		}
		stalls.devices[dev] = true
	}
	stalls.running++
	stalls.Unlock()
	go func() {
		if r := <-done; r.h != nil {
			r.h.Close()
		}
		stalls.Lock()
		stalls.running--
		stalls.Unlock()
	}()
	return nil, fmt.Errorf("%w after %v", ErrStalled, OpenTimeout)
}
