package unwind

import (
	"cmp"
	"debug/elf"
	"errors"
	"slices"
)

// CodeRange is the code one FDE describes: [Start, End) in ELF virtual addresses.
type CodeRange struct {
	Start, End uint64
}

// RangeAt returns the range of ranges (sorted by start, as FunctionRanges returns them)
// that holds pc.
func RangeAt(ranges []CodeRange, pc uint64) (CodeRange, bool) {
	i, found := slices.BinarySearchFunc(ranges, pc, func(r CodeRange, pc uint64) int {
		switch {
		case r.End <= pc:
			return -1
		case r.Start > pc:
			return 1
		}
		return 0
	})
	if !found {
		return CodeRange{}, false
	}
	return ranges[i], true
}

// FunctionRanges lists the code ranges of f's .eh_frame FDEs, sorted by start. Compilers
// emit one FDE per function (or per part of one that was split, like gcc's .cold
// sections), so where a stripped file names nothing, the FDE covering an address stands
// for its function. Where FDEs overlap, the one starting first keeps its range, as in
// the unwind table.
func FunctionRanges(f *elf.File) ([]CodeRange, error) {
	if f.Class != elf.ELFCLASS64 || f.Machine != machine {
		return nil, errors.New("unwind: unsupported file")
	}
	b := bases{data: sectionAddr(f, ".got"), text: sectionAddr(f, ".text")}
	var sec *frameSection
	var hdr *ehHdr
	if s := f.Section(".eh_frame"); usable(s) {
		data, err := sectionData(s)
		if err != nil {
			return nil, err
		}
		sec = &frameSection{data: data, addr: s.Addr, bases: b}
		if hs := f.Section(".eh_frame_hdr"); usable(hs) {
			if hd, err := sectionData(hs); err == nil {
				if h, ok := parseHdr(hd, hs.Addr, b.text); ok {
					hdr = &h
				}
			}
		}
	} else if len(f.Sections) <= 1 {
		var err error
		if sec, hdr, err = ehFrameFromSegments(f, b); err != nil {
			return nil, err
		}
	}
	if sec == nil {
		return nil, nil
	}
	cies := make(map[int]*cie)
	var fdes []fde
	ok := false
	if hdr != nil {
		fdes, ok = hdr.fdes(sec, cies, nil)
	}
	if !ok {
		fdes = sec.walk(cies, nil)
	}
	slices.SortStableFunc(fdes, func(a, b fde) int { return cmp.Compare(a.start, b.start) })
	out := make([]CodeRange, 0, len(fdes))
	var covered uint64
	for _, d := range fdes {
		if d.end <= d.start || d.end <= covered {
			continue
		}
		out = append(out, CodeRange{Start: max(d.start, covered), End: d.end})
		covered = d.end
	}
	return slices.Clip(out), nil
}
