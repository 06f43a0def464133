package objfile

import (
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
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

// MappedELF parses a file from its mapped contents: SectionData then hands out its
// uncompressed sections in place. The caller reads the file under mmapfile.Guard and
// keeps the mapping while it uses the sections.
func MappedELF(contents []byte) (*elf.File, error) { return NewELF(mapped(contents)) }

// InspectELF parses the handle's file over a read-only mapping of it and calls fn with it
// under mmapfile.Guard, so that SectionData hands out sections where they lie rather
// than copies (a large library's symbol and relocation tables are megabytes). What fn
// keeps must not point into the file: the mapping goes when InspectELF returns. A file
// that cannot be mapped is parsed through reads. errNotELF is returned when the file
// does not parse.
func (h *Handle) InspectELF(errNotELF error, fn func(*elf.File) error) error {
	f, region, err := h.MapELF()
	if err != nil {
		if f, err = h.ELF(); err != nil {
			return errNotELF
		}
		return fn(f)
	}
	defer region.Close()
	if fault := mmapfile.Guard(func() { err = fn(f) }); fault != nil {
		return fmt.Errorf("%s: %w", h.name, fault)
	}
	return err
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

// GiveBack gives back the resident pages under b, a slice of what SectionData returned
// for s, when s is read in place from a mapping (MapELF): a scan through a large table
// then keeps a window of it resident rather than all it has read, the pages staying in
// the page cache. For a section read into memory it does nothing.
func GiveBack(s *elf.Section, b []byte) {
	if s == nil || len(b) == 0 {
		return
	}
	if _, ok := inPlace(s); ok {
		mmapfile.ReleaseMapped(b)
	}
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

// ReadVaddr reads n bytes of f's image at a virtual address, from the loadable segment
// holding them; bytes past the segment's file contents (.bss) are not there.
func ReadVaddr(f *elf.File, vaddr uint64, n uint64) ([]byte, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || vaddr < p.Vaddr || vaddr-p.Vaddr >= p.Filesz {
			continue
		}
		off := vaddr - p.Vaddr
		return ProgData(p, off, min(n, p.Filesz-off))
	}
	return nil, fmt.Errorf("address %#x: not in the file", vaddr)
}

// LookupSymbol finds the first symbol called name in f's .symtab.
func LookupSymbol(f *elf.File, name string) (value uint64, info byte, ok bool) {
	s, ok, _ := FindSymbol(f, elf.SHT_SYMTAB, name, false)
	return s.Value, s.Info, ok
}

// Symbol is one entry of a symbol table.
type Symbol struct {
	Index   int // in its table, where the null symbol is 0, as relocations count
	Info    byte
	Section elf.SectionIndex
	Value   uint64
	Size    uint64
}

// FindSymbol finds the first symbol called name in f's table of type typ (SHT_SYMTAB or
// SHT_DYNSYM), skipping undefined ones if defined is set. It scans the table where it
// lies (in place, for a file from MapELF) rather than building debug/elf's list of every
// symbol with its name: megabytes for a large Go binary or a JVM's library, to find one
// or two. The error says why a table present could not be read.
func FindSymbol(f *elf.File, typ elf.SectionType, name string, defined bool) (Symbol, bool, error) {
	t, err := OpenSymbols(f, typ)
	if t == nil {
		return Symbol{}, false, err
	}
	for i := 1; i < t.Len(); i++ { // entry 0 is the null symbol
		if i%giveBackEvery == 0 {
			t.GiveBack()
		}
		if !t.NameIs(i, name) {
			continue
		}
		if s := t.At(i); !defined || s.Section != elf.SHN_UNDEF {
			return s, true, nil
		}
	}
	return Symbol{}, false, nil
}

// giveBackEvery is how many entries a scan reads between giving back the pages it made
// resident: 4 096 symbols are 96 KB of table, and a C++ program's names for them about
// 300 KB. Several readers scan a new program's tables at once (node's, 110 000 symbols:
// the unwind tables, the runtimes' and the trace context's inspections).
const giveBackEvery = 1 << 12

// Symbols is a 64-bit symbol table read where it lies: an entry and its name are
// decoded when asked for.
type Symbols struct {
	syms, strs     []byte
	order          binary.ByteOrder
	symSec, strSec *elf.Section
}

// symSize is an Elf64_Sym's: name u32, info, other u8, shndx u16, value, size u64.
const symSize = 24

// OpenSymbols returns f's table of type typ (SHT_SYMTAB or SHT_DYNSYM), nil when f has
// none, and an error when the table present cannot be read.
func OpenSymbols(f *elf.File, typ elf.SectionType) (*Symbols, error) {
	table := f.SectionByType(typ)
	if table == nil || f.Class != elf.ELFCLASS64 {
		return nil, nil
	}
	if int(table.Link) >= len(f.Sections) {
		return nil, fmt.Errorf("%s links to section %d of %d", table.Name, table.Link, len(f.Sections))
	}
	syms, err := SectionData(table, MaxSectionSize)
	if err != nil {
		return nil, err
	}
	strs, err := SectionData(f.Sections[table.Link], MaxSectionSize)
	if err != nil {
		return nil, err
	}
	return &Symbols{syms: syms, strs: strs, order: f.ByteOrder, symSec: table, strSec: f.Sections[table.Link]}, nil
}

// GiveBack gives back the resident pages of the table, when it is read in place: a scan
// of a large program's table (a Go program's, megabytes) calls it as it goes.
func (t *Symbols) GiveBack() {
	GiveBack(t.symSec, t.syms)
	GiveBack(t.strSec, t.strs)
}

// Len is the number of entries, the null symbol 0 included.
func (t *Symbols) Len() int { return len(t.syms) / symSize }

// At decodes entry i, which must be below Len.
func (t *Symbols) At(i int) Symbol {
	e := t.syms[i*symSize:]
	return Symbol{
		Index:   i,
		Info:    e[4],
		Section: elf.SectionIndex(t.order.Uint16(e[6:])),
		Value:   t.order.Uint64(e[8:]),
		Size:    t.order.Uint64(e[16:]),
	}
}

// NameIs says whether entry i, below Len, is called name, without copying its name.
func (t *Symbols) NameIs(i int, name string) bool {
	at := uint64(t.order.Uint32(t.syms[i*symSize:]))
	end := at + uint64(len(name))
	return end < uint64(len(t.strs)) && t.strs[end] == 0 && string(t.strs[at:end]) == name
}

// Each calls fn with each entry's index and name, the null symbol left out, until fn
// returns false. The name is the table's own bytes, valid while the table is: copy what
// is kept. An entry whose name lies outside the string table has an empty one.
func (t *Symbols) Each(fn func(i int, name []byte) bool) {
	for i := 1; i < t.Len(); i++ {
		if i%giveBackEvery == 0 {
			t.GiveBack() // names handed out stay readable: the file backs them
		}
		if !fn(i, t.name(i)) {
			return
		}
	}
}

func (t *Symbols) name(i int) []byte {
	at := uint64(t.order.Uint32(t.syms[i*symSize:]))
	if at >= uint64(len(t.strs)) {
		return nil
	}
	s := t.strs[at:]
	if n := bytes.IndexByte(s, 0); n >= 0 {
		return s[:n]
	}
	return nil
}

// Elf is entry i as debug/elf spells a symbol, its name copied.
func (t *Symbols) Elf(i int) elf.Symbol {
	s := t.At(i)
	return elf.Symbol{Name: string(t.name(i)), Info: s.Info, Section: s.Section, Value: s.Value, Size: s.Size}
}

// Name returns entry i's name, copied; "" when it lies outside the string table.
func (t *Symbols) Name(i int) string { return string(t.name(i)) }

// Loads are a file's PT_LOAD segments, which say where in memory a mapping of the file
// puts each of its bytes.
type Loads []elf.ProgHeader

// LoadsOf returns f's PT_LOAD segments.
func LoadsOf(f *elf.File) Loads {
	var l Loads
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			l = append(l, p.ProgHeader)
		}
	}
	return l
}

// Bias returns the load bias of the file mapped at start from file offset offset: what
// is added to an ELF virtual address to find it in the process.
func (l Loads) Bias(start, offset uint64) (uint64, bool) {
	for _, p := range l {
		if p.Off <= offset && offset < p.Off+p.Filesz {
			return start - (p.Vaddr + offset - p.Off), true
		}
	}
	return 0, false
}
