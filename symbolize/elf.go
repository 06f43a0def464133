package symbolize

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"slices"

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
	cands, err := symbolCandidates(f, true)
	if err != nil {
		return nil, err
	}
	return &ELFSymbols{Funcs: newSymbolTable(cands), loads: loadSegments(f)}, nil
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
// read: debug/elf holds every symbol of a table at once, and a hostile or absurd
// table must not take the agent's memory. Real ones stay far below (libc's .symtab
// is 250 KiB; large C++ programs' reach tens of MiB).
const maxSymbolTableSize = 512 << 20

// symbolCandidates reads the functions of .symtab and, if withDynsym, .dynsym. A
// table that cannot be read is left out and named in the error, so that the other
// one still serves.
func symbolCandidates(f *elf.File, withDynsym bool) (cands []candidate, err error) {
	var errs []error
	for _, read := range []struct {
		section string
		typ     elf.SectionType
		symbols func() ([]elf.Symbol, error)
		dynamic bool
	}{
		{".symtab", elf.SHT_SYMTAB, f.Symbols, false},
		// A stripped binary keeps only .dynsym; an unstripped one may export names
		// there that .symtab spells the same, which merging at one address absorbs.
		{".dynsym", elf.SHT_DYNSYM, f.DynamicSymbols, true},
	} {
		if read.dynamic && !withDynsym {
			continue
		}
		if size := symbolTableSize(f, read.typ); size > maxSymbolTableSize {
			errs = append(errs, fmt.Errorf("%s and its strings take %d bytes, over the bound of %d", read.section, size, maxSymbolTableSize))
			continue
		}
		list, err := readSymbols(read.symbols)
		if errors.Is(err, elf.ErrNoSymbols) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", read.section, err))
			continue
		}
		cands = appendFuncs(cands, f, list, read.dynamic)
	}
	return cands, errors.Join(errs...)
}

// readSymbols calls read, turning a panic of debug/elf on hostile input into an error.
func readSymbols(read func() ([]elf.Symbol, error)) (list []elf.Symbol, err error) {
	defer func() {
		if p := recover(); p != nil {
			list, err = nil, fmt.Errorf("corrupt symbol table: %v", p)
		}
	}()
	return read()
}

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

// appendFuncs appends the defined functions among list that lie in executable sections.
func appendFuncs(cands []candidate, f *elf.File, list []elf.Symbol, dynamic bool) []candidate {
	for _, s := range list {
		switch elf.ST_TYPE(s.Info) {
		case elf.STT_FUNC, elf.STT_GNU_IFUNC:
		default:
			continue
		}
		if s.Value == 0 || s.Section == elf.SHN_UNDEF || int(s.Section) >= len(f.Sections) {
			continue
		}
		sec := f.Sections[s.Section]
		if sec.Flags&elf.SHF_EXECINSTR == 0 {
			continue
		}
		limit := sec.Addr + sec.Size
		if limit < sec.Addr {
			limit = ^uint64(0)
		}
		cands = append(cands, candidate{
			Symbol: Symbol{Name: s.Name, Value: s.Value, Size: s.Size, Binding: elf.ST_BIND(s.Info), Dynamic: dynamic},
			limit:  limit,
		})
	}
	return cands
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

// LookupFileOffset returns the function at an offset in the file.
func (e *ELFSymbols) LookupFileOffset(fileOffset uint64) (Symbol, bool) {
	vaddr, ok := e.Vaddr(fileOffset)
	if !ok {
		return Symbol{}, false
	}
	return e.Funcs.Lookup(vaddr)
}
