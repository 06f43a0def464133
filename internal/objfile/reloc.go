package objfile

import (
	"cmp"
	"debug/elf"
	"encoding/binary"
	"slices"
)

// Relocations are the words a file's dynamic relocations set, as the loader would at
// load bias 0: where a position-independent file keeps a pointer in its data, the file
// itself may hold 0 there, and only the relocation says what the process will see.
type Relocations struct {
	words []reloc // sorted by address
}

type reloc struct{ at, value uint64 }

// Relocation types read: the base plus the addend, and a symbol's value plus the addend.
const (
	relX86Relative   = 8    // R_X86_64_RELATIVE
	relX86Abs64      = 1    // R_X86_64_64
	relX86GlobDat    = 6    // R_X86_64_GLOB_DAT
	relArm64Relative = 1027 // R_AARCH64_RELATIVE
	relArm64Abs64    = 257  // R_AARCH64_ABS64
	relArm64GlobDat  = 1025 // R_AARCH64_GLOB_DAT
)

// relaSize is an Elf64_Rela's: offset, info, addend.
const relaSize = 24

// ReadRelocations reads f's dynamic relocations (SHT_RELA sections that are loaded):
// the relative ones always, those naming a symbol defined in f when withSymbols is set.
// A table that cannot be read is left out: its words read as the file holds them.
func ReadRelocations(f *elf.File, withSymbols bool) *Relocations {
	r := &Relocations{}
	if f == nil || f.Class != elf.ELFCLASS64 {
		return r
	}
	var relative, abs, globDat uint32
	switch f.Machine {
	case elf.EM_X86_64:
		relative, abs, globDat = relX86Relative, relX86Abs64, relX86GlobDat
	case elf.EM_AARCH64:
		relative, abs, globDat = relArm64Relative, relArm64Abs64, relArm64GlobDat
	default:
		return r
	}
	var syms *Symbols
	for _, s := range f.Sections {
		if s.Type != elf.SHT_RELA || s.Flags&elf.SHF_ALLOC == 0 {
			continue
		}
		data, err := SectionData(s, MaxSectionSize)
		if err != nil {
			continue
		}
		for b := data; len(b) >= relaSize; b = b[relaSize:] {
			off, info, addend := f.ByteOrder.Uint64(b), f.ByteOrder.Uint64(b[8:]), f.ByteOrder.Uint64(b[16:])
			switch typ := uint32(info); {
			case typ == relative:
				r.words = append(r.words, reloc{off, addend})
			case withSymbols && (typ == abs || typ == globDat):
				if syms == nil {
					if syms, _ = OpenSymbols(f, elf.SHT_DYNSYM); syms == nil {
						continue
					}
				}
				i := int(info >> 32)
				if i <= 0 || i >= syms.Len() {
					continue
				}
				if sym := syms.At(i); sym.Section != elf.SHN_UNDEF {
					r.words = append(r.words, reloc{off, sym.Value + addend})
				}
			}
		}
		GiveBack(s, data)
	}
	slices.SortFunc(r.words, func(a, b reloc) int { return cmp.Compare(a.at, b.at) })
	return r
}

// Len is the number of words set.
func (r *Relocations) Len() int { return len(r.words) }

func (r *Relocations) find(addr uint64) (int, bool) {
	return slices.BinarySearchFunc(r.words, addr, func(w reloc, addr uint64) int { return cmp.Compare(w.at, addr) })
}

// Word returns the word a relocation sets at addr, if one does.
func (r *Relocations) Word(addr uint64) (uint64, bool) {
	if i, ok := r.find(addr); ok {
		return r.words[i].value, true
	}
	return 0, false
}

// Each calls fn with every address a relocation sets and its word, in address order,
// until fn returns false.
func (r *Relocations) Each(fn func(at, value uint64) bool) {
	for _, w := range r.words {
		if !fn(w.at, w.value) {
			return
		}
	}
}

// Apply writes into b, the file's bytes at addr, the words relocations set there.
func (r *Relocations) Apply(b []byte, addr uint64, order binary.ByteOrder) {
	i, _ := r.find(addr)
	for ; i < len(r.words) && r.words[i].at+8 <= addr+uint64(len(b)); i++ {
		order.PutUint64(b[r.words[i].at-addr:], r.words[i].value)
	}
}
