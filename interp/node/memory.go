package node

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Memory reads a process's memory.
type Memory interface {
	// ReadAt fills p from address addr, or fails: a partial read is a failure.
	ReadAt(p []byte, addr uint64) error
}

// ProcessMemory reads a live process's memory with process_vm_readv.
type ProcessMemory uint32

var errShortRead = errors.New("short read")

func (pid ProcessMemory) ReadAt(p []byte, addr uint64) error {
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
		return fmt.Errorf("read %d bytes at %#x of pid %d: %w", len(p), addr, uint32(pid), errShortRead)
	}
	return nil
}

func readU64(m Memory, addr uint64) (uint64, error) {
	var b [8]byte
	if err := m.ReadAt(b[:], addr); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}
