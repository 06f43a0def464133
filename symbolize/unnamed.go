package symbolize

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
	"github.com/sonde-profiler/sonde/unwind"
)

// Where names of code without a symbol come from, as trace.Location.NameSource records
// them.
const (
	// SourcePLT: a PLT entry, named symbol@plt after the relocation of the GOT slot it
	// jumps through, as objdump names it.
	SourcePLT = "plt"
	// SourceFDE: code a stripped object names nowhere, named object+0xSTART after the
	// start of the .eh_frame FDE that covers it: one name per function, so that its
	// samples add up.
	SourceFDE = "fde"
)

// unnamedCode names what an object's symbols do not: its PLT entries, and, when it has
// no .symtab, its functions by their FDEs.
type unnamedCode struct {
	object string     // the file's base name
	plt    []pltEntry // sorted by start, not overlapping
	fdes   []unwind.CodeRange
}

type pltEntry struct {
	start, end uint64
	name       string
}

// readUnnamed reads what names an object's code without symbols. It returns nil when
// there is nothing of the kind; errors only cost names.
func readUnnamed(f *elf.File, path string) *unnamedCode {
	u := &unnamedCode{object: filepath.Base(path), plt: pltEntries(f)}
	if f.Section(".symtab") == nil {
		u.fdes, _ = unwind.FunctionRanges(f)
	}
	if len(u.plt) == 0 && len(u.fdes) == 0 {
		return nil
	}
	return u
}

func (u *unnamedCode) sizeBytes() int64 {
	n := int64(len(u.fdes)) * 16
	for _, e := range u.plt {
		n += 40 + int64(len(e.name))
	}
	return n
}

// lookup names the code at an ELF virtual address.
func (u *unnamedCode) lookup(vaddr uint64) ([]trace.Line, string) {
	if i := sort.Search(len(u.plt), func(i int) bool { return u.plt[i].end > vaddr }); i < len(u.plt) && u.plt[i].start <= vaddr {
		return []trace.Line{{Function: u.plt[i].name, SystemName: u.plt[i].name}}, SourcePLT
	}
	if i := sort.Search(len(u.fdes), func(i int) bool { return u.fdes[i].End > vaddr }); i < len(u.fdes) && u.fdes[i].Start <= vaddr {
		name := fmt.Sprintf("%s+%#x", u.object, u.fdes[i].Start)
		return []trace.Line{{Function: name, SystemName: name}}, SourceFDE
	}
	return nil, SourceNone
}

// x86-64 relocations that fill the GOT slots PLT entries jump through.
const (
	rGlobDat   = 6  // R_X86_64_GLOB_DAT: .plt.got, for functions also taken by address
	rJumpSlot  = 7  // R_X86_64_JUMP_SLOT: .plt and .plt.sec
	rIRelative = 37 // R_X86_64_IRELATIVE: ifuncs of static binaries
)

// maxPLTSection bounds the PLT and relocation sections read; real ones hold some
// thousands of entries.
const maxPLTSection = 16 << 20

// pltEntries names the entries of a file's PLT sections the way objdump does: each
// entry jumps through a GOT slot (jmp *disp32(%rip), with or without endbr64 and bnd
// before it), and the relocation that fills the slot names the function.
func pltEntries(f *elf.File) []pltEntry {
	if f.Machine != elf.EM_X86_64 || f.Class != elf.ELFCLASS64 {
		return nil
	}
	slots := gotSlots(f)
	if len(slots) == 0 {
		return nil
	}
	var out []pltEntry
	for _, name := range []string{".plt", ".plt.sec", ".plt.got"} {
		s := f.Section(name)
		if s == nil || s.Type == elf.SHT_NOBITS || s.Size > maxPLTSection {
			continue
		}
		code, err := s.Data()
		if err != nil {
			continue
		}
		size := s.Entsize
		if size != 8 && size != 16 {
			// A static binary's PLT of ifuncs has entries of 8 bytes, jmp and a nop, and no
			// entry size in its header.
			size = 16
			if len(code) >= 10 && code[0] == 0xff && code[1] == 0x25 && code[8] == 0xff && code[9] == 0x25 {
				size = 8
			}
		}
		for off := uint64(0); off+size <= uint64(len(code)); off += size {
			e := code[off : off+size]
			for i := 0; i+6 <= len(e); i++ {
				if e[i] != 0xff || e[i+1] != 0x25 {
					continue
				}
				slot := s.Addr + off + uint64(i) + 6 + uint64(int64(int32(binary.LittleEndian.Uint32(e[i+2:]))))
				if n, ok := slots[slot]; ok {
					out = append(out, pltEntry{start: s.Addr + off, end: s.Addr + off + size, name: n + "@plt"})
				}
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b pltEntry) int { return cmpUint64(a.start, b.start) })
	// Overlapping entries are corrupt input: keep the first.
	kept := out[:0]
	for _, e := range out {
		if n := len(kept); n > 0 && e.start < kept[n-1].end {
			continue
		}
		kept = append(kept, e)
	}
	return kept
}

func cmpUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// gotSlots maps GOT slots to the names of the functions their relocations resolve.
func gotSlots(f *elf.File) map[uint64]string {
	// The table is read in place and only the names relocations use are copied: a JVM's
	// library exports tens of thousands of symbols, and listing them all with
	// debug/elf cost megabytes per library.
	syms, _ := objfile.OpenSymbols(f, elf.SHT_DYNSYM)
	slots := map[uint64]string{}
	for _, s := range f.Sections {
		if s.Type != elf.SHT_RELA || s.Size > maxPLTSection || s.Flags&elf.SHF_ALLOC == 0 {
			continue
		}
		data, err := objfile.SectionData(s, maxPLTSection)
		if err != nil {
			continue
		}
		for off := 0; off+24 <= len(data); off += 24 {
			at := binary.LittleEndian.Uint64(data[off:])
			info := binary.LittleEndian.Uint64(data[off+8:])
			addend := int64(binary.LittleEndian.Uint64(data[off+16:]))
			switch typ, sym := uint32(info), info>>32; typ {
			case rJumpSlot, rGlobDat:
				if syms == nil || sym == 0 || sym >= uint64(syms.Len()) {
					continue
				}
				name := syms.Name(int(sym))
				if name == "" {
					continue
				}
				if i := strings.IndexByte(name, '@'); i > 0 {
					name = name[:i]
				}
				slots[at] = name
			case rIRelative:
				slots[at] = fmt.Sprintf("*ABS*+%#x", addend)
			}
		}
	}
	return slots
}
