package objfile

import (
	"cmp"
	"debug/elf"
	"fmt"
	"io"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
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

// mapped is a file mapped whole, read through as an io.ReaderAt.
type mapped []byte

func (m mapped) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= int64(len(m)) {
		return 0, io.EOF
	}
	n := copy(p, m[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// MapELF parses the handle's file over a read-only mapping of it. SectionData then
// hands out sections stored uncompressed as slices of the mapping: reading a 10 MB
// pclntab or .eh_frame costs page cache, not a heap copy the collector frees at its
// leisure. Whatever reads the file or its sections must run under mmapfile.Guard, and
// nothing read may be kept past region.Close but copies.
func (h *Handle) MapELF() (f *elf.File, region *mmapfile.Region, err error) {
	region, err = mmapfile.MapFD(h.Fd(), h.size, h.name)
	if err != nil {
		return nil, nil, err
	}
	fault := mmapfile.Guard(func() { f, err = NewELF(mapped(region.Bytes())) })
	if err = cmp.Or(fault, err); err != nil {
		region.Close()
		return nil, nil, fmt.Errorf("%s: %w", h.name, err)
	}
	return f, region, nil
}

// inPlace returns an uncompressed section of a file parsed by MapELF as a slice of its
// mapping.
func inPlace(s *elf.Section) ([]byte, bool) {
	if s.Flags&elf.SHF_COMPRESSED != 0 {
		return nil, false
	}
	sr, ok := s.ReaderAt.(*io.SectionReader)
	if !ok {
		return nil, false
	}
	r, off, n := sr.Outer()
	m, ok := r.(mapped)
	if !ok || off < 0 || n < 0 || off > int64(len(m)) || n > int64(len(m))-off {
		return nil, false
	}
	return m[off : off+n : off+n], true
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
	if b, ok := inPlace(s); ok {
		return b, nil
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

// LookupSymbol finds the first symbol called name in f's .symtab, scanning the table where
// it lies (in place, for a file from MapELF) rather than building debug/elf's list of
// every symbol with its name: megabytes for a large Go binary, to find one or two.
func LookupSymbol(f *elf.File, name string) (value uint64, info byte, ok bool) {
	const entSize = 24 // Elf64_Sym: name u32, info, other u8, shndx u16, value, size u64
	symtab := f.Section(".symtab")
	if symtab == nil || symtab.Type != elf.SHT_SYMTAB || f.Class != elf.ELFCLASS64 || int(symtab.Link) >= len(f.Sections) {
		return 0, 0, false
	}
	syms, err := SectionData(symtab, MaxSectionSize)
	if err != nil {
		return 0, 0, false
	}
	strs, err := SectionData(f.Sections[symtab.Link], MaxSectionSize)
	if err != nil {
		return 0, 0, false
	}
	for off := entSize; off+entSize <= len(syms); off += entSize { // entry 0 is the null symbol
		at := uint64(f.ByteOrder.Uint32(syms[off:]))
		end := at + uint64(len(name))
		if end < uint64(len(strs)) && strs[end] == 0 && string(strs[at:end]) == name {
			return f.ByteOrder.Uint64(syms[off+8:]), syms[off+4], true
		}
	}
	return 0, 0, false
}
