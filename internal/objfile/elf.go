package objfile

import (
	"debug/elf"
	"fmt"
	"io"
)

// MaxSectionSize bounds what one section may make a reader allocate, whatever a header
// claims. The largest real sections sonde reads (.eh_frame of browsers, LLVM's symbol
// tables, DWARF of big C++ programs) stay below it.
const MaxSectionSize = 512 << 20

// NewELF parses ELF headers. debug/elf trusts header fields more than a hostile or
// truncated file deserves and has panicked on such input before: a bad file must cost
// one error, not the agent.
func NewELF(r io.ReaderAt) (f *elf.File, err error) {
	defer func() {
		if p := recover(); p != nil {
			f, err = nil, fmt.Errorf("corrupt ELF file: %v", p)
		}
	}()
	f, err = elf.NewFile(r)
	if err != nil {
		return nil, fmt.Errorf("parse ELF: %w", err)
	}
	return f, nil
}

// ELF parses the handle's file.
func (h *Handle) ELF() (*elf.File, error) {
	f, err := NewELF(h)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", h.name, err)
	}
	return f, nil
}

// SectionData reads a section, decompressed, if it and its claimed size are within
// limit: a header claiming 2⁶² bytes costs an error, not an allocation. debug/elf reads
// what the file really holds in chunks, so a size within the limit that the file does not
// back fails early too.
func SectionData(s *elf.Section, limit uint64) (b []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			b, err = nil, fmt.Errorf("read %s: corrupt section: %v", s.Name, p)
		}
	}()
	if s.Type == elf.SHT_NOBITS {
		return nil, fmt.Errorf("read %s: section has no data in this file", s.Name)
	}
	if s.Size > limit || s.FileSize > limit {
		return nil, fmt.Errorf("read %s: %d bytes, over the bound of %d", s.Name, max(s.Size, s.FileSize), limit)
	}
	b, err = s.Data()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", s.Name, err)
	}
	return b, nil
}

// ProgData reads n bytes at off of a segment, bounded like SectionData.
func ProgData(p *elf.Prog, off, n uint64) ([]byte, error) {
	if n > MaxSectionSize || off > p.Filesz || n > p.Filesz-off {
		return nil, fmt.Errorf("read segment at %#x: %d bytes at %d of %d", p.Vaddr, n, off, p.Filesz)
	}
	// ReadAll grows with the data actually present, so a corrupt Filesz cannot make it
	// allocate more than the file holds.
	b, err := io.ReadAll(io.NewSectionReader(p, int64(off), int64(n)))
	if err == nil && uint64(len(b)) != n {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return nil, fmt.Errorf("read segment at %#x: %w", p.Vaddr, err)
	}
	return b, nil
}
