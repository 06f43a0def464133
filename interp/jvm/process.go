package jvm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
)

// ErrNotReady: the JVM had not set up what was read yet (its code cache, its
// interpreter): it was read while starting, and is read again later.
var ErrNotReady = errors.New("not initialised yet")

// Process is one HotSpot process as sonde reads it: its tables, their layout, and the
// code heaps of its code cache.
type Process struct {
	m      Memory
	lib    *LibJVM
	bias   uint64
	VM     *VMStructs
	Layout *Layout
	// Version is the JVM's major version (Abstract_VM_Version::_vm_major_version).
	Version int
	x       byte // UNSIGNED5's excluded bytes: 1 from JDK 20 on, 0 before

	mu    sync.Mutex
	heaps []CodeHeap
}

// NewProcess reads HotSpot's tables from a process mapping lib at bias.
func NewProcess(m Memory, lib *LibJVM, bias uint64) (*Process, error) {
	vs, err := ReadVMStructs(m, &lib.Symbols, bias)
	if err != nil {
		return nil, err
	}
	l, err := NewLayout(vs)
	if err != nil {
		return nil, err
	}
	v, err := readU32(m, l.versionAddr)
	if err != nil {
		return nil, fmt.Errorf("read the JVM's version: %w", err)
	}
	p := &Process{m: m, lib: lib, bias: bias, VM: vs, Layout: l, Version: int(int32(v))}
	if p.Version == 0 {
		return nil, fmt.Errorf("jvm major version 0: %w", ErrNotReady)
	}
	if p.Version < 9 || p.Version > 1000 {
		return nil, fmt.Errorf("jvm major version %d: implausible", p.Version)
	}
	// JDK 20 (JDK-8292758) made UNSIGNED5 skip the zero byte; nothing in the tables
	// tells the encoding, the version does.
	if p.Version >= 20 {
		p.x = 1
	}
	return p, nil
}

// StreamExcluded is the number of byte values UNSIGNED5 skips in this JVM's compressed
// streams (debug info, line number tables): 0 before JDK 20, 1 since.
func (p *Process) StreamExcluded() byte { return p.x }

// Bias is libjvm.so's load bias in the process.
func (p *Process) Bias() uint64 { return p.bias }

// maxRead bounds a single read of a structure or table from the process.
const maxRead = 16 << 20

func (p *Process) read(addr uint64, n uint64) ([]byte, error) {
	if n > maxRead {
		return nil, fmt.Errorf("read of %d bytes at %#x: larger than anything sonde reads", n, addr)
	}
	if addr+n < addr {
		return nil, fmt.Errorf("read of %d bytes at %#x: wraps", n, addr)
	}
	b := make([]byte, n)
	if err := p.m.ReadAt(b, addr); err != nil {
		return nil, err
	}
	return b, nil
}

// record is a structure read from the process, whose members are decoded from it.
type record []byte

// span is the number of bytes from a structure's start that cover all of ms.
func span(ms ...Member) uint64 {
	var n uint64
	for _, m := range ms {
		n = max(n, m.Offset+uint64(m.Size))
	}
	return n
}

func (r record) u(m Member) uint64 {
	if m.Size == 0 || m.Offset > uint64(len(r)) || uint64(len(r))-m.Offset < uint64(m.Size) {
		return 0
	}
	b := r[m.Offset:]
	switch m.Size {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b))
	default:
		return binary.LittleEndian.Uint64(b)
	}
}

// i is a signed member, sign-extended from its size.
func (r record) i(m Member) int64 {
	v := r.u(m)
	switch m.Size {
	case 1:
		return int64(int8(v))
	case 2:
		return int64(int16(v))
	case 4:
		return int64(int32(v))
	}
	return int64(v)
}

func (p *Process) record(addr uint64, ms ...Member) (record, error) {
	b, err := p.read(addr, span(ms...))
	return record(b), err
}
