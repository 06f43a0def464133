// Package procmem reads the memory of other processes, for the runtimes' packages that
// name frames from what a process holds (code objects, functions, scripts).
package procmem

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Reader reads a process's memory.
type Reader interface {
	// ReadAt fills p from address addr, or fails: a partial read is a failure.
	ReadAt(p []byte, addr uint64) error
}

// Process reads a live process's memory with process_vm_readv: one system call, no file to
// open, and a process that exited fails with ESRCH.
type Process uint32

// ErrShortRead is a read the process answered only in part: the range crosses into memory
// it does not map.
var ErrShortRead = errors.New("short read")

func (pid Process) ReadAt(p []byte, addr uint64) error {
	if len(p) == 0 {
		return nil
	}
	local := []unix.Iovec{{Base: &p[0], Len: uint64(len(p))}}
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(p)}}
	n, err := unix.ProcessVMReadv(int(pid), local, remote, 0)
	if err != nil {
		return fmt.Errorf("read %d bytes at %#x of pid %d: %w", len(p), addr, uint32(pid), err)
	}
	if n != len(p) {
		return fmt.Errorf("read %d bytes at %#x of pid %d: %w", len(p), addr, uint32(pid), ErrShortRead)
	}
	return nil
}

// ReadU64 reads a little-endian 64-bit word at addr.
func ReadU64(m Reader, addr uint64) (uint64, error) {
	var b [8]byte
	if err := m.ReadAt(b[:], addr); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}
