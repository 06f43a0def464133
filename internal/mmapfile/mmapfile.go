package mmapfile

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Region is a file mapped read-only, whole.
type Region struct {
	data    []byte // nil once closed, and for an empty file
	size    int64  // the file's size when mapped
	cleanup runtime.Cleanup
}

// newRegion returns a region for data, unmapped by the collector as a backstop
// should its owner drop it without closing it: nothing may then point into data
// but what the owner held too.
func newRegion(data []byte, size int64) *Region {
	r := &Region{data: data, size: size}
	r.cleanup = runtime.AddCleanup(r, func(data []byte) { _ = unix.Munmap(data) }, data)
	return r
}

// Map maps f read-only. The mapping outlives f: the caller may close f at once. An
// empty file gives an empty region. Readahead is off: a lookup reads a few scattered
// pages, and a read brings in the pages around it only if something else (a process
// running the binary) had them cached already.
func Map(f *os.File) (*Region, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", f.Name(), err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("map %s: not a regular file", f.Name())
	}
	return MapFD(int(f.Fd()), st.Size(), f.Name())
}

// MapFD maps the first size bytes of the regular file open at fd, as Map does, for a
// caller that checked the file and measured it already: named name in errors.
func MapFD(fd int, size int64, name string) (*Region, error) {
	if size == 0 {
		return &Region{}, nil
	}
	if size < 0 || int64(int(size)) != size {
		return nil, fmt.Errorf("map %s: size %d", name, size)
	}
	data, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", name, err)
	}
	// Advice is a hint; a kernel refusing it changes nothing but residency.
	_ = unix.Madvise(data, unix.MADV_RANDOM)
	return newRegion(data, size), nil
}

// Anon returns size bytes of private anonymous memory, readable and writable, for
// scratch data without pointers that is dropped at a known time: its pages cost
// memory once written and go back to the system at Close, without waiting for a
// garbage collection, and the collector neither scans nor paces on them.
func Anon(size int) (*Region, error) {
	if size < 0 {
		return nil, fmt.Errorf("anonymous mapping of %d bytes", size)
	}
	if size == 0 {
		return &Region{}, nil
	}
	data, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("anonymous mapping of %d bytes: %w", size, err)
	}
	return newRegion(data, int64(size)), nil
}

// Bytes returns the mapped file. The slice is valid until Close and must only be
// read under Guard.
func (r *Region) Bytes() []byte {
	if r == nil {
		return nil
	}
	return r.data
}

// Size is the size of the file when it was mapped.
func (r *Region) Size() int64 {
	if r == nil {
		return 0
	}
	return r.size
}

// Close unmaps the region. Nothing read from it may be used afterwards, except
// copies, and it must not run while another goroutine reads the region. Closing
// twice is harmless.
func (r *Region) Close() error {
	if r == nil {
		return nil
	}
	if r.data == nil {
		return nil
	}
	r.cleanup.Stop()
	err := unix.Munmap(r.data)
	r.data = nil
	if err != nil {
		return fmt.Errorf("unmap: %w", err)
	}
	return nil
}

// Release tells the kernel the process is done with the pages under b, a slice of
// the region: they leave its resident set and stay in the page cache, from where a
// later read maps them again without I/O. Parsers call it after a pass over a whole
// table whose lookups will touch a few pages of it.
func (r *Region) Release(b []byte) {
	if r == nil || len(b) == 0 || len(r.data) == 0 {
		return
	}
	off := offsetOf(r.data, b)
	if off < 0 {
		return
	}
	page := os.Getpagesize()
	start := (off + page - 1) &^ (page - 1) // whole pages inside b only: its neighbours may be in use
	end := (off + len(b)) &^ (page - 1)
	if end-start <= 0 {
		return
	}
	_ = unix.Madvise(r.data[start:end], unix.MADV_DONTNEED)
}

// ReleaseMapped is Release for a caller that holds b, a slice of a private read-only
// file mapping, without its Region. b must lie in such a mapping: the pages of
// anonymous or written memory would be lost.
func ReleaseMapped(b []byte) {
	if len(b) == 0 {
		return
	}
	page := uintptr(os.Getpagesize())
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	start := (p + page - 1) &^ (page - 1)
	end := (p + uintptr(len(b))) &^ (page - 1)
	if end <= start {
		return
	}
	_, _, _ = unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_DONTNEED)
}

// offsetOf returns where b starts in data, or -1 when b is not a part of data.
func offsetOf(data, b []byte) int {
	if len(b) == 0 || len(data) == 0 {
		return -1
	}
	d0 := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	b0 := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if b0 < d0 || b0-d0 > uintptr(len(data)) || uintptr(len(data))-(b0-d0) < uintptr(len(b)) {
		return -1
	}
	return int(b0 - d0)
}

// FaultError is a memory fault met while reading a mapping: the file shrank under it,
// or its storage failed.
type FaultError struct {
	Addr uintptr
}

func (e *FaultError) Error() string {
	return fmt.Sprintf("memory fault at %#x reading a mapped file: it changed or shrank while mapped", e.Addr)
}

// ErrFault matches every *FaultError under errors.Is.
var ErrFault = errors.New("memory fault reading a mapped file")

// Is makes errors.Is(err, ErrFault) hold for a FaultError.
func (e *FaultError) Is(target error) bool { return target == ErrFault }

// Fault returns the fault a recovered panic value stands for, or nil when it is
// another panic. With panic-on-fault on, the runtime panics with an error that
// carries the faulting address; a nil dereference panics without one.
func Fault(p any) *FaultError {
	if fe, ok := p.(*FaultError); ok {
		return fe
	}
	err, ok := p.(error)
	if !ok {
		return nil
	}
	var addr interface{ Addr() uintptr }
	if !errors.As(err, &addr) {
		return nil
	}
	return &FaultError{Addr: addr.Addr()}
}

// Guard runs fn with faults on mapped memory turned into a *FaultError. Other panics
// go on as they came. Panic-on-fault is per goroutine and restored when fn returns.
func Guard(fn func()) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if p := recover(); p != nil {
			fe := Fault(p)
			if fe == nil {
				panic(p)
			}
			err = fe
		}
	}()
	fn()
	return nil
}
