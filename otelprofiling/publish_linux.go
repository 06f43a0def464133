//go:build linux

package otelprofiling

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The process context header (OTEP 4719): signature, version, payload_size,
// monotonic_published_at_ns, payload pointer; the payload follows it in the mapping.
const (
	headerSize    = 32
	headerVersion = 2
	mappingName   = "OTEL_CTX"
)

var (
	mu sync.Mutex
	// header is the published mapping, kept for the process's life: readers find it
	// by its name in /proc/PID/maps. payloads keeps every payload ever pointed at.
	header   []byte
	payloads [][]byte
)

// publish publishes payload as the process context, or updates the one published.
func publish(payload []byte) error {
	mu.Lock()
	defer mu.Unlock()
	// The payload gets a mapping of its own, which the garbage collector never moves or frees.
	data, err := unix.Mmap(-1, 0, max(len(payload), 1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("map process context payload: %w", err)
	}
	copy(data, payload)
	payloads = append(payloads, data)
	if header == nil {
		if header, err = newMapping(); err != nil {
			return err
		}
		copy(header, mappingName)
		binary.NativeEndian.PutUint32(header[8:], headerVersion)
	} else {
		// An update: readers see 0 and wait until the new timestamp.
		atomic.StoreUint64(publishedAt(), 0)
	}
	binary.NativeEndian.PutUint32(header[12:], uint32(len(payload)))
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&header[24])), uint64(uintptr(unsafe.Pointer(&data[0]))))
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return fmt.Errorf("read CLOCK_BOOTTIME: %w", err)
	}
	now := uint64(ts.Nano())
	if now == 0 {
		now = 1
	}
	// Sequentially consistent: every field above is visible before the timestamp is.
	atomic.StoreUint64(publishedAt(), now)
	name(header)
	return nil
}

func publishedAt() *uint64 { return (*uint64)(unsafe.Pointer(&header[16])) }

// newMapping makes the mapping readers look for: a memfd named OTEL_CTX, else an
// anonymous mapping the name is given to, not inherited across fork.
func newMapping() ([]byte, error) {
	size := unix.Getpagesize()
	var m []byte
	fd, err := unix.MemfdCreate(mappingName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_NOEXEC_SEAL)
	if err != nil {
		fd, err = unix.MemfdCreate(mappingName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err == nil {
		// Any failure here falls back to the anonymous mapping below.
		if unix.Ftruncate(fd, int64(size)) == nil {
			m, _ = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
		}
		unix.Close(fd)
	}
	if m == nil {
		if m, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
			return nil, fmt.Errorf("map process context: %w", err)
		}
	}
	if err := unix.Madvise(m, unix.MADV_DONTFORK); err != nil {
		unix.Munmap(m)
		return nil, fmt.Errorf("keep process context from children: %w", err)
	}
	return m, nil
}

// name names the mapping; kernels without CONFIG_ANON_VMA_NAME refuse, which a memfd's
// own name makes up for.
func name(m []byte) {
	n := append([]byte(mappingName), 0)
	_ = unix.Prctl(unix.PR_SET_VMA, unix.PR_SET_VMA_ANON_NAME, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&n[0])))
}
