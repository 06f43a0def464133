package symbolize

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"slices"
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
func ReadELF(r io.ReaderAt) (syms *ELFSymbols, err error) {
	// debug/elf trusts header fields more than a hostile or truncated file deserves
	// and has panicked on such input before; a bad file must cost one error, not the agent.
	defer func() {
		if p := recover(); p != nil {
			syms, err = nil, fmt.Errorf("corrupt ELF file: %v", p)
		}
	}()
	f, err := elf.NewFile(r)
	if err != nil {
		return nil, fmt.Errorf("parse ELF: %w", err)
	}

	syms = &ELFSymbols{}
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Filesz == 0 {
			continue
		}
		syms.loads = append(syms.loads, loadSegment{
			off: p.Off, filesz: p.Filesz, vaddr: p.Vaddr, exec: p.Flags&elf.PF_X != 0,
		})
	}
	// Executable segments first: they are the ones sampled code lives in, and so the
	// right answer should a broken file make segments overlap in the file.
	slices.SortStableFunc(syms.loads, func(a, b loadSegment) int {
		switch {
		case a.exec == b.exec:
			return 0
		case a.exec:
			return -1
		default:
			return 1
		}
	})

	var cands []candidate
	for _, read := range []struct {
		section string
		symbols func() ([]elf.Symbol, error)
	}{
		{".symtab", f.Symbols},
		// A stripped binary keeps only .dynsym; an unstripped one may export names
		// there that .symtab spells the same, which merging at one address absorbs.
		{".dynsym", f.DynamicSymbols},
	} {
		list, err := read.symbols()
		if errors.Is(err, elf.ErrNoSymbols) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", read.section, err)
		}
		cands = appendFuncs(cands, f, list)
	}
	syms.Funcs = newSymbolTable(cands)
	return syms, nil
}

// appendFuncs appends the defined functions among list that lie in executable sections.
func appendFuncs(cands []candidate, f *elf.File, list []elf.Symbol) []candidate {
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
			Symbol: Symbol{Name: s.Name, Value: s.Value, Size: s.Size, Binding: elf.ST_BIND(s.Info)},
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
