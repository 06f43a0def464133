package unwind

import (
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"iter"
	"slices"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// maxSectionSize bounds what a corrupt header (or a compressed .debug_frame) can make the
// parser allocate. The largest real .eh_frame sections (browsers, LLVM) are tens of
// megabytes.
const maxSectionSize = 256 << 20

// Read builds the unwind table of the ELF file in r.
func Read(r io.ReaderAt) (*Table, error) {
	f, err := objfile.NewELF(r)
	if err != nil {
		return nil, fmt.Errorf("unwind: %w", err)
	}
	return FromELF(f)
}

// sectionData reads a section within maxSectionSize.
func sectionData(s *elf.Section) ([]byte, error) {
	b, err := objfile.SectionData(s, maxSectionSize)
	if err != nil {
		return nil, fmt.Errorf("unwind: %w", err)
	}
	return b, nil
}

// usable reports whether a section exists and has contents in this file; a separate
// debug file keeps allocated sections as SHT_NOBITS.
func usable(s *elf.Section) bool {
	return s != nil && s.Type != elf.SHT_NOBITS && s.Size > 0
}

// FromELF builds the unwind table of f from .eh_frame, falling back to .debug_frame when
// the file has no .eh_frame. A file without section headers has .eh_frame found through
// its PT_GNU_EH_FRAME segment instead.
func FromELF(f *elf.File) (*Table, error) {
	src, err := frameSourceOf(f)
	if err != nil {
		return nil, err
	}
	return build(src.sec, src.hdr, src.name), nil
}

// frameSource is the call frame section a file's table is built from.
type frameSource struct {
	sec  *frameSection
	hdr  *ehHdr // .eh_frame_hdr's sorted table of FDEs, or nil
	name string // ".eh_frame" or ".debug_frame"
}

// frameSourceOf finds f's call frame section, as FromELF describes.
func frameSourceOf(f *elf.File) (frameSource, error) {
	if f.Class != elf.ELFCLASS64 || f.Machine != machine || !tableArch {
		return frameSource{}, fmt.Errorf("unwind: unsupported %s %s file", f.Class, f.Machine)
	}
	if f.Type == elf.ET_REL {
		// Addresses in a relocatable object are meaningless until relocations are applied.
		return frameSource{}, errors.New("unwind: relocatable objects are not supported")
	}
	// Only i386 compilers emit datarel in .eh_frame, relative to the GOT as libgcc has it;
	// x86-64 output uses pcrel, so these bases matter for odd producers only.
	b := bases{data: sectionAddr(f, ".got"), text: sectionAddr(f, ".text")}

	if s := f.Section(".eh_frame"); usable(s) {
		data, err := sectionData(s)
		if err != nil {
			return frameSource{}, err
		}
		sec := &frameSection{data: data, addr: s.Addr, bases: b}
		var hdr *ehHdr
		if hs := f.Section(".eh_frame_hdr"); usable(hs) {
			// A broken header only costs the sorted table: .eh_frame can still be walked.
			if hd, err := sectionData(hs); err == nil {
				if h, ok := parseHdr(hd, hs.Addr, b.text); ok {
					hdr = &h
				}
			}
		}
		return frameSource{sec, hdr, ".eh_frame"}, nil
	}

	if len(f.Sections) <= 1 {
		// No section headers (sstrip, some packers): find .eh_frame the way the runtime
		// unwinder does. With headers, a PT_GNU_EH_FRAME without .eh_frame is a leftover
		// of objcopy -R and points at nothing.
		sec, hdr, err := ehFrameFromSegments(f, b)
		if err != nil {
			return frameSource{}, err
		}
		if sec != nil {
			return frameSource{sec, hdr, ".eh_frame"}, nil
		}
	}

	if s := f.Section(".debug_frame"); usable(s) {
		data, err := sectionData(s)
		if err != nil {
			return frameSource{}, err
		}
		sec := &frameSection{data: data, addr: s.Addr, bases: b, debug: true}
		return frameSource{sec, nil, ".debug_frame"}, nil
	}
	return frameSource{}, errors.New("unwind: no .eh_frame or .debug_frame")
}

func sectionAddr(f *elf.File, name string) uint64 {
	if s := f.Section(name); s != nil {
		return s.Addr
	}
	return 0
}

// ehFrameFromSegments finds .eh_frame through PT_GNU_EH_FRAME in a file without the
// section. It returns a nil section when the file has no such segment.
func ehFrameFromSegments(f *elf.File, b bases) (*frameSection, *ehHdr, error) {
	var hp *elf.Prog
	for _, p := range f.Progs {
		if p.Type == elf.PT_GNU_EH_FRAME {
			hp = p
			break
		}
	}
	if hp == nil {
		return nil, nil, nil
	}
	hd, err := progData(hp, 0, hp.Filesz)
	if err != nil {
		return nil, nil, err
	}
	h, ok := parseHdr(hd, hp.Vaddr, b.text)
	if !ok {
		return nil, nil, errors.New("unwind: malformed PT_GNU_EH_FRAME header")
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || h.ehFrame < p.Vaddr || h.ehFrame-p.Vaddr >= p.Filesz {
			continue
		}
		// Only the section header records .eh_frame's size: read to the end of the
		// segment and let the walk stop at the zero terminator crtend.o supplies.
		off := h.ehFrame - p.Vaddr
		data, err := progData(p, off, p.Filesz-off)
		if err != nil {
			return nil, nil, err
		}
		return &frameSection{data: data, addr: h.ehFrame, bases: b, stopAtZero: true}, &h, nil
	}
	return nil, nil, fmt.Errorf("unwind: .eh_frame at %#x is outside the loaded segments", h.ehFrame)
}

func progData(p *elf.Prog, off, n uint64) ([]byte, error) {
	if n > maxSectionSize {
		return nil, fmt.Errorf("unwind: reading segment at %#x: size %d too large", p.Vaddr, n)
	}
	b, err := objfile.ProgData(p, off, n)
	if err != nil {
		return nil, fmt.Errorf("unwind: %w", err)
	}
	return b, nil
}

// build turns a call frame section into a table.
func build(sec *frameSection, hdr *ehHdr, source string) *Table {
	return buildWithGap(sec, hdr, source, Row{})
}

// buildWithGap turns a call frame section into a table whose addresses outside every FDE
// have the rule gap, from address 0 on.
func buildWithGap(sec *frameSection, hdr *ehHdr, source string, gap Row) *Table {
	fdes := sortedFDEs(sec, hdr)
	b := builder{sec: sec, gap: gap, rowSink: &rowSink{rows: make([]Row, 0, rowEstimate(len(sec.data), len(fdes)))}}
	b.run(fdeList(fdes))
	return &Table{Source: source, Rows: b.rows}
}

// fdeList hands out the FDEs of a list in its order.
func fdeList(fdes []fde) iter.Seq[*fde] {
	return func(yield func(*fde) bool) {
		for i := range fdes {
			if !yield(&fdes[i]) {
				return
			}
		}
	}
}

// sortedFDEs lists a section's FDEs by start address, from its sorted table when it has a
// sound one.
func sortedFDEs(sec *frameSection, hdr *ehHdr) []fde {
	cies := make(map[int]*cie)
	var fdes []fde
	ok := false
	if hdr != nil {
		fdes, ok = hdr.fdes(sec, cies, make([]fde, 0, hdr.count))
	}
	if !ok {
		// An FDE takes at least 16 bytes of small functions' 24-ish; overestimating by a
		// little beats regrowing.
		fdes = sec.walk(cies, make([]fde, 0, len(sec.data)/24))
	}
	byStart := func(a, b fde) int { return cmp.Compare(a.start, b.start) }
	if !slices.IsSortedFunc(fdes, byStart) {
		// Stable, so that among FDEs with equal starts the table's (or file's) first wins.
		slices.SortStableFunc(fdes, byStart)
	}
	return fdes
}

// rowEstimate guesses the final row count to allocate once. gcc's output for libc and
// libstdc++ averages one merged row per 5.4-5.9 bytes of .eh_frame, plus a gap row for some
// FDEs; erring high costs one trimming copy, erring low a regrowth.
func rowEstimate(sectionSize, fdes int) int {
	return sectionSize/5 + fdes/4 + 16
}
