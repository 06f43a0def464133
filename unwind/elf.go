package unwind

import (
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"slices"
	"unsafe"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
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
func FromELF(f *elf.File) (*Table, error) { return fromELF(f, false) }

// fromELF is FromELF, with the rows built in scratch memory off the Go heap when scratch
// is set: the table must then be released once its rows are used (Table.release).
func fromELF(f *elf.File, scratch bool) (*Table, error) {
	if f.Class != elf.ELFCLASS64 || f.Machine != machine || !tableArch {
		return nil, fmt.Errorf("unwind: unsupported %s %s file", f.Class, f.Machine)
	}
	if f.Type == elf.ET_REL {
		// Addresses in a relocatable object are meaningless until relocations are applied.
		return nil, errors.New("unwind: relocatable objects are not supported")
	}
	// Only i386 compilers emit datarel in .eh_frame, relative to the GOT as libgcc has it;
	// x86-64 output uses pcrel, so these bases matter for odd producers only.
	b := bases{data: sectionAddr(f, ".got"), text: sectionAddr(f, ".text")}

	if s := f.Section(".eh_frame"); usable(s) {
		data, err := sectionData(s)
		if err != nil {
			return nil, err
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
		return build(sec, hdr, ".eh_frame", scratch), nil
	}

	if len(f.Sections) <= 1 {
		// No section headers (sstrip, some packers): find .eh_frame the way the runtime
		// unwinder does. With headers, a PT_GNU_EH_FRAME without .eh_frame is a leftover
		// of objcopy -R and points at nothing.
		sec, hdr, err := ehFrameFromSegments(f, b)
		if err != nil {
			return nil, err
		}
		if sec != nil {
			return build(sec, hdr, ".eh_frame", scratch), nil
		}
	}

	if s := f.Section(".debug_frame"); usable(s) {
		data, err := sectionData(s)
		if err != nil {
			return nil, err
		}
		sec := &frameSection{data: data, addr: s.Addr, bases: b, debug: true}
		return build(sec, nil, ".debug_frame", scratch), nil
	}
	return nil, errors.New("unwind: no .eh_frame or .debug_frame")
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
func build(sec *frameSection, hdr *ehHdr, source string, scratch bool) *Table {
	return buildWithGap(sec, hdr, source, Row{}, scratch)
}

// buildWithGap turns a call frame section into a table whose addresses outside every FDE
// have the rule gap, from address 0 on; with scratch, its rows off the Go heap.
func buildWithGap(sec *frameSection, hdr *ehHdr, source string, gap Row, scratch bool) *Table {
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

	t := &Table{Source: source}
	var rows []Row
	if scratch {
		rows, t.scratch = scratchRows(rowBound(len(sec.data), len(fdes)))
	}
	if rows == nil {
		rows = make([]Row, 0, rowEstimate(len(sec.data), len(fdes)))
	}
	b := builder{sec: sec, rows: rows, gap: gap}
	if gap.CFA != CFAInvalid {
		b.emit(0, gap)
	}
	b.build(fdes)
	// The estimate's slack is not trimmed by a copy: a table lives only until its rows
	// go to the kernel, and the copy would hold the rows twice at the agent's peak.
	t.Rows = b.rows
	return t
}

// rowBound is room for more rows than a section yields: a row needs an advance and a
// change of rule, two bytes of instructions at least, and each FDE may add a row where
// it starts, one where it ends and a gap row before it. A hostile section that yields
// more (a CIE's instructions run again for each of its FDEs) spills to the Go heap, as
// append grows a slice past its capacity.
func rowBound(sectionSize, fdes int) int {
	return sectionSize/2 + 3*fdes + 16
}

// maxScratchRows bounds the address space reserved for one table's rows (1.5 GiB): only
// the pages written are resident, but an address space limit (ulimit -v) may be set.
const maxScratchRows = 64 << 20

// scratchRows reserves room for n rows in private anonymous memory, resident only where
// written and returned to the system when the region closes, not at a collection after
// it: the rows of a large library (libpython has 64 000, 1.5 MB; Node's executable
// 550 000, 13 MB) go to the kernel and are dropped at once. On the heap, the estimate
// that sizes them erred low for libpython by 5 %, and the regrowth held them twice and a
// quarter: 3.6 MB allocated for 1.5 MB of rows. It returns nil where the memory cannot
// be had; the rows are then built on the heap.
func scratchRows(n int) ([]Row, *mmapfile.Region) {
	n = min(n, maxScratchRows)
	r, err := mmapfile.Anon(n * int(unsafe.Sizeof(Row{})))
	if err != nil || len(r.Bytes()) == 0 {
		return nil, nil
	}
	return unsafe.Slice((*Row)(unsafe.Pointer(unsafe.SliceData(r.Bytes()))), n)[:0], r
}

// rowEstimate guesses the final row count to allocate once. gcc's output for libc and
// libstdc++ averages one merged row per 5.4-5.9 bytes of .eh_frame, plus a gap row for some
// FDEs; erring high costs one trimming copy, erring low a regrowth.
func rowEstimate(sectionSize, fdes int) int {
	return sectionSize/5 + fdes/4 + 16
}
