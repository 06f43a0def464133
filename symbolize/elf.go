package symbolize

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"unsafe"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/objfile"
)

// ELFSymbols holds what naming addresses of one ELF file needs: its functions and the
// layout of its loadable segments.
type ELFSymbols struct {
	// Funcs are the functions of .symtab and .dynsym together, by ELF virtual address.
	Funcs *SymbolTable
	loads []loadSegment
}

// loadSegment is a PT_LOAD program header, reduced to what maps file offsets to addresses.
type loadSegment struct {
	off, filesz, vaddr uint64
	exec               bool
}

// ReadELF reads the function symbols and loadable segments of an ELF file. A file
// without any symbol table is not an error: its table is empty and every lookup misses.
func ReadELF(r io.ReaderAt) (*ELFSymbols, error) {
	f, err := objfile.NewELF(r)
	if err != nil {
		return nil, err
	}
	var sr symbolReader
	if err := sr.read(f, nil, nil, true); err != nil {
		return nil, err
	}
	return &ELFSymbols{Funcs: sr.table(nil), loads: loadSegments(f)}, nil
}

// mapFile maps f, or returns nil when it cannot: its tables are then read into memory.
func mapFile(f *objfile.Handle) *mmapfile.Region {
	m, err := mmapfile.MapFD(f.Fd(), f.Size(), f.Name())
	if err != nil {
		return nil
	}
	return m
}

// loadSegments returns the PT_LOAD headers of f, executable ones first: they are the
// ones sampled code lives in, and so the right answer should a broken file make
// segments overlap in the file.
func loadSegments(f *elf.File) []loadSegment {
	var loads []loadSegment
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Filesz == 0 {
			continue
		}
		loads = append(loads, loadSegment{
			off: p.Off, filesz: p.Filesz, vaddr: p.Vaddr, exec: p.Flags&elf.PF_X != 0,
		})
	}
	slices.SortStableFunc(loads, func(a, b loadSegment) int { return cmpBool(b.exec, a.exec) })
	return loads
}

// maxSymbolTableSize bounds the bytes of one symbol table and its strings that are
// read: a hostile or absurd table must not take the agent's memory or time. Real
// ones stay far below (libc's .symtab is 250 KiB; large C++ programs' reach tens of
// MiB).
const maxSymbolTableSize = 512 << 20

// symbolReader gathers the functions of one or more ELF files' symbol tables, for
// one SymbolTable. It reads the entries where they lie, in the mapped file when
// there is one, rather than through debug/elf, which builds an elf.Symbol with its
// own name string for every symbol of a table, functions or not. The functions
// are only counted until table says which to keep: a Go binary's .symtab lists
// every Go function, which the pclntab names, and those are never materialised.
type symbolReader struct {
	tables []symbolSection
	names  []nameTable
	funcs  int // function symbols the tables hold
}

// symbolSection is one symbol table read, waiting for table.
type symbolSection struct {
	f        *elf.File
	syms     []byte // the entries, entry 0 included
	entSize  int
	src      uint8 // its string table in names
	dynamic  bool
	secs     []inSection // what symbols need of the sections they are defined in
	m        *mmapfile.Region
	mapped   bool // syms lie in m
	strBytes []byte
}

// giveBack lets go of the resident pages of the entries and their names, where they
// lie in the mapped file.
func (t *symbolSection) giveBack() {
	if t.mapped {
		t.m.Release(t.syms)
	}
	if t.strBytes != nil {
		t.m.Release(t.strBytes)
	}
}

// inSection is what a symbol needs of the section it is defined in: whether it is
// code, and where an unsized symbol must end.
type inSection struct {
	exec  bool
	limit uint64
}

// read adds the functions of f's .symtab and, if withDynsym, .dynsym. file is f's
// contents when mapped (m), else nil and the tables are read through f: names
// then get copied, while the table built from a mapped file keeps pointing into its
// string tables. A table that cannot be read is left out and named in the error, so
// that the other one still serves.
func (sr *symbolReader) read(f *elf.File, file []byte, m *mmapfile.Region, withDynsym bool) error {
	var errs []error
	for _, read := range []struct {
		section string
		typ     elf.SectionType
		dynamic bool
	}{
		{".symtab", elf.SHT_SYMTAB, false},
		// A stripped binary keeps only .dynsym; an unstripped one may export names
		// there that .symtab spells the same, which merging at one address absorbs.
		{".dynsym", elf.SHT_DYNSYM, true},
	} {
		if read.dynamic && !withDynsym {
			continue
		}
		if size := symbolTableSize(f, read.typ); size > maxSymbolTableSize {
			errs = append(errs, fmt.Errorf("%s and its strings take %d bytes, over the bound of %d", read.section, size, maxSymbolTableSize))
			continue
		}
		if err := sr.readTable(f, file, m, read.typ, read.dynamic); err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", read.section, err))
		}
	}
	return errors.Join(errs...)
}

// empty says the tables read hold no function.
func (sr *symbolReader) empty() bool { return sr.funcs == 0 }

// symbolTableSize is the size of the first section of type typ and of its string table.
func symbolTableSize(f *elf.File, typ elf.SectionType) uint64 {
	for _, s := range f.Sections {
		if s.Type != typ {
			continue
		}
		size := s.Size
		if int(s.Link) < len(f.Sections) {
			size += f.Sections[s.Link].Size
		}
		return size
	}
	return 0
}

// Sizes of Elf32_Sym and Elf64_Sym.
const (
	sym32Size = 16
	sym64Size = 24
)

// readTable takes the first section of type typ and its string table, and counts
// its functions.
func (sr *symbolReader) readTable(f *elf.File, file []byte, m *mmapfile.Region, typ elf.SectionType, dynamic bool) error {
	var sec *elf.Section
	for _, s := range f.Sections {
		if s.Type == typ {
			sec = s
			break
		}
	}
	if sec == nil {
		return nil
	}
	if sec.Link == 0 || int(sec.Link) >= len(f.Sections) {
		return errors.New("section has invalid string table link")
	}
	entSize := sym64Size
	if f.Class == elf.ELFCLASS32 {
		entSize = sym32Size
	}
	syms, mappedSyms, err := sectionBytes(sec, file)
	if err != nil {
		return err
	}
	if len(syms)%entSize != 0 {
		return fmt.Errorf("length %d is not a multiple of the symbol size %d", len(syms), entSize)
	}
	if len(syms) == 0 {
		return nil
	}
	strs, mappedStrs, err := sectionBytes(f.Sections[sec.Link], file)
	if err != nil {
		return fmt.Errorf("string table: %w", err)
	}
	if len(sr.names) >= maxSources || uint64(len(strs)) > math.MaxUint32 {
		return errors.New("too many or too large string tables")
	}
	secs := make([]inSection, len(f.Sections))
	for i, s := range f.Sections {
		limit := s.Addr + s.Size
		if limit < s.Addr {
			limit = math.MaxUint64
		}
		secs[i] = inSection{exec: s.Flags&elf.SHF_EXECINSTR != 0, limit: limit}
	}
	t := symbolSection{f: f, syms: syms, entSize: entSize, src: uint8(len(sr.names)), dynamic: dynamic,
		secs: secs, m: m, mapped: mappedSyms}
	if mappedStrs {
		t.strBytes = strs
	}
	sr.names = append(sr.names, nameTable{s: unsafe.String(unsafe.SliceData(strs), len(strs)), keep: mappedStrs})
	t.each(func(uint64, uint64, uint32, byte, uint16) { sr.funcs++ })
	sr.tables = append(sr.tables, t)
	return nil
}

// each calls fn with every defined function of the table that lies in an
// executable section, as debug/elf's Symbols and DynamicSymbols would list them.
func (t *symbolSection) each(fn func(value, size uint64, nameOff uint32, info byte, shndx uint16)) {
	order := t.f.ByteOrder
	n := 0
	// Entry 0 is the undefined symbol, which debug/elf leaves out too.
	for b := t.syms[t.entSize:]; len(b) >= t.entSize; b = b[t.entSize:] {
		// A large program's table and names (node's: 10 MB) are given back as the scan
		// passes them, rather than all resident at its end.
		if n++; n%(1<<12) == 0 {
			t.giveBack()
		}
		var (
			nameOff     uint32
			info        byte
			shndx       uint16
			value, size uint64
		)
		if t.entSize == sym64Size {
			nameOff, info, shndx = order.Uint32(b), b[4], order.Uint16(b[6:])
			value, size = order.Uint64(b[8:]), order.Uint64(b[16:])
		} else {
			nameOff, value, size = order.Uint32(b), uint64(order.Uint32(b[4:])), uint64(order.Uint32(b[8:]))
			info, shndx = b[12], order.Uint16(b[14:])
		}
		switch elf.ST_TYPE(info) {
		case elf.STT_FUNC, elf.STT_GNU_IFUNC:
		default:
			continue
		}
		if value == 0 || shndx == uint16(elf.SHN_UNDEF) || int(shndx) >= len(t.secs) || !t.secs[shndx].exec {
			continue
		}
		fn(value, size, nameOff, info, shndx)
	}
}

// table builds the symbol table. Functions starting where goCode holds, the code a
// Go binary's pclntab names, are left out: the pclntab answers for those addresses
// before the symbol table is asked. goCode may be nil.
func (sr *symbolReader) table(goCode func(addr uint64) bool) *SymbolTable {
	keep := func(value uint64) bool { return goCode == nil || !goCode(value) }
	n := 0
	if goCode == nil {
		n = sr.funcs
	} else {
		for i := range sr.tables {
			sr.tables[i].each(func(value, _ uint64, _ uint32, _ byte, _ uint16) {
				if keep(value) {
					n++
				}
			})
		}
	}
	cands := make([]candidate, 0, n)
	for i := range sr.tables {
		t := &sr.tables[i]
		strs := sr.names[t.src].s
		t.each(func(value, size uint64, nameOff uint32, info byte, shndx uint16) {
			if !keep(value) {
				return
			}
			// A name past the string table reads as empty, as debug/elf has it; one
			// without its terminating NUL runs to the table's end.
			var nameLen int
			if uint64(nameOff) < uint64(len(strs)) {
				rest := strs[nameOff:]
				rest = rest[:min(len(rest), maxNameLen)]
				if nameLen = strings.IndexByte(rest, 0); nameLen < 0 {
					nameLen = len(rest)
				}
			} else {
				nameOff = 0
			}
			cands = append(cands, candidate{
				value: value, size: size, limit: t.secs[shndx].limit,
				nameOff: nameOff, nameLen: uint32(nameLen), src: t.src,
				binding: elf.ST_BIND(info), dynamic: t.dynamic,
			})
		})
		// The entries were read for good; lookups read a few names later.
		t.giveBack()
	}
	tab := newSymbolTable(cands, sr.names)
	// Ordering aliases compared their names: all of a large program's, read again.
	for i := range sr.tables {
		sr.tables[i].giveBack()
	}
	*sr = symbolReader{}
	return tab
}

// sectionBytes returns the contents of s: in place in file, the mapped file, when it
// is there uncompressed, else read. mapped says which.
func sectionBytes(s *elf.Section, file []byte) (data []byte, mapped bool, err error) {
	if s.Type == elf.SHT_NOBITS {
		return nil, false, nil
	}
	if file != nil && s.Flags&elf.SHF_COMPRESSED == 0 {
		if s.Offset > uint64(len(file)) || uint64(len(file))-s.Offset < s.FileSize {
			return nil, false, fmt.Errorf("section %s at %#x+%#x is past the end of the file (%#x)", s.Name, s.Offset, s.FileSize, len(file))
		}
		return file[s.Offset : s.Offset+s.FileSize], true, nil
	}
	data, err = readSection(s)
	return data, false, err
}

// readSection reads a section through debug/elf, growing with what it yields rather
// than allocating the size a header claims.
func readSection(s *elf.Section) (data []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			data, err = nil, fmt.Errorf("corrupt section %s: %v", s.Name, p)
		}
	}()
	if s.Size > maxSymbolTableSize {
		return nil, fmt.Errorf("section %s of %d bytes is over the bound of %d", s.Name, s.Size, maxSymbolTableSize)
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(s.Open(), int64(s.Size))); err != nil {
		return nil, fmt.Errorf("read %s: %w", s.Name, err)
	}
	if uint64(buf.Len()) != s.Size {
		return nil, fmt.Errorf("read %s: %d of %d bytes", s.Name, buf.Len(), s.Size)
	}
	return buf.Bytes(), nil
}

// Vaddr converts an offset in the file, which is what a mapping gives, to the ELF
// virtual address symbols use, through the PT_LOAD segment holding that offset.
func (e *ELFSymbols) Vaddr(fileOffset uint64) (uint64, bool) {
	for _, p := range e.loads {
		if fileOffset >= p.off && fileOffset-p.off < p.filesz {
			return fileOffset - p.off + p.vaddr, true
		}
	}
	return 0, false
}

// FileOffset converts an ELF virtual address to its offset in the file, through the
// PT_LOAD segment holding it.
func (e *ELFSymbols) FileOffset(vaddr uint64) (uint64, bool) {
	for _, p := range e.loads {
		if vaddr >= p.vaddr && vaddr-p.vaddr < p.filesz {
			return vaddr - p.vaddr + p.off, true
		}
	}
	return 0, false
}

// LookupFileOffset returns the function at an offset in the file.
func (e *ELFSymbols) LookupFileOffset(fileOffset uint64) (Symbol, bool) {
	vaddr, ok := e.Vaddr(fileOffset)
	if !ok {
		return Symbol{}, false
	}
	return e.Funcs.Lookup(vaddr)
}
