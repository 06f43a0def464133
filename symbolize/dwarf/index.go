package dwarf

import (
	"cmp"
	"container/heap"
	"debug/dwarf"
	"fmt"
	"slices"
)

// buildIndex walks .debug_info once, reading each unit's header and DIE, and says
// which addresses each unit's code takes. A unit .debug_aranges lists takes the ranges
// listed there; any other, the ranges its DIE states (DW_AT_low_pc/high_pc,
// DW_AT_ranges); a unit whose DIE states none (dwz's partial units, odd producers) is
// decoded once, after the walk, and takes the addresses of its line sequences and
// functions. It also checks the unit's line program header, so that what the old eager
// decoding rejected at load still fails here. The aranges are trusted only if every
// set names a unit where one starts, with its address size; else no unit takes them.
func buildIndex(s *sections) ([]unit, []unitSpan, error) {
	sets := parseAranges(s)
	// The addresses a caller is about to look up: the units covering them keep what
	// decoding them needs as the walk passes it (Table.Prepare would walk again).
	var want []uint64
	if t := s.t; t != nil {
		want, t.pending = t.pending, nil
	}
	wanted := func(i int, spans []unitSpan) bool {
		for _, sp := range spans {
			for _, a := range want {
				if a >= sp.lo && a < sp.hi {
					s.t.want[uint32(i)] = true
				}
			}
		}
		return s.t != nil && s.t.want[uint32(i)]
	}
	var (
		spans, listedSpans []unitSpan
		listed, later      []int // units aranges lists; units to decode once all are known
		matched            int
		ranges             [][2]uint64
	)
	// ownRanges adds the spans unit i's DIE states, and says whether there were any.
	ownRanges := func(units []unit, i int) (bool, error) {
		u := &units[i]
		abbrevs, err := unitAbbrev(s, u)
		if err != nil {
			return false, fmt.Errorf("unit at %#x: %w", u.off, err)
		}
		c, cu, err := openUnit(s, u, abbrevs)
		if err != nil {
			return false, fmt.Errorf("unit at %#x: %w", u.off, err)
		}
		if cu.lowPC.kind != valAddress && cu.ranges.kind == valNone {
			return false, nil
		}
		if ranges, err = c.ranges(cu, cu, ranges[:0]); err != nil {
			return false, fmt.Errorf("ranges of unit at %#x: %w", u.off, err)
		}
		n := len(spans)
		for _, rg := range ranges {
			if rg[0] != 0 && rg[0] < rg[1] {
				spans = append(spans, unitSpan{lo: rg[0], hi: rg[1], unit: uint32(i)})
			}
		}
		if len(want) > 0 && wanted(i, spans[n:]) {
			s.t.pinUnit(u)
		}
		return len(spans) > n, nil
	}
	units, err := walkUnits(s, func(units []unit) error {
		i := len(units) - 1
		u := &units[i]
		if err := s.need(secInfo, u.off, u.end); err != nil {
			return err
		}
		if s.t != nil {
			s.t.slide(secInfo, u.off)
			s.t.slide(secAbbrev, u.abbrev)
		}
		set, isListed := sets[u.off]
		if isListed {
			if set.asize != u.asize {
				sets = nil // not to be trusted
			} else {
				matched++
				listed = append(listed, i)
				n := len(listedSpans)
				for _, rg := range set.ranges {
					listedSpans = append(listedSpans, unitSpan{lo: rg[0], hi: rg[1], unit: uint32(i)})
				}
				if len(want) > 0 {
					wanted(i, listedSpans[n:])
				}
			}
		}
		abbrevs, err := unitAbbrev(s, u)
		if err != nil {
			return fmt.Errorf("unit at %#x: %w", u.off, err)
		}
		_, cu, err := openUnit(s, u, abbrevs)
		if err != nil {
			return fmt.Errorf("unit at %#x: %w", u.off, err)
		}
		if cu.tag != dwarf.TagCompileUnit && cu.tag != dwarf.TagPartialUnit {
			return nil
		}
		if line := s.data[secLine]; cu.stmtList.kind == valInt && line != nil {
			end, err := s.needLine(cu.stmtList.u)
			if err == nil {
				err = checkLineProgram(line, int64(cu.stmtList.u))
			}
			if err != nil {
				return fmt.Errorf("line table of unit at %#x: %w", u.off, err)
			}
			u.line, u.lineEnd = cu.stmtList.u, end
			if s.t != nil {
				s.t.slide(secLine, u.line)
			}
		}
		if sets != nil && isListed {
			if s.t != nil && s.t.want[uint32(i)] {
				s.t.pinUnit(u)
			}
			return nil
		}
		if found, err := ownRanges(units, i); found || err != nil {
			return err
		}
		later = append(later, i)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if sets != nil && matched == len(sets) {
		spans = append(spans, listedSpans...)
	} else {
		// The aranges named a unit that is not there: the units they listed take
		// their own ranges after all.
		for _, i := range listed {
			if err := s.needUnit(&units[i]); err != nil {
				return nil, nil, err
			}
			if found, err := ownRanges(units, i); err != nil {
				return nil, nil, err
			} else if !found {
				later = append(later, i)
			}
		}
		slices.Sort(later)
	}
	for _, i := range later {
		ut, err := decodeUnit(s, units, i)
		if err != nil {
			return nil, nil, fmt.Errorf("unit at %#x: %w", units[i].off, err)
		}
		n := len(spans)
		spans = ut.appendSpans(spans, uint32(i))
		if len(want) > 0 && wanted(i, spans[n:]) {
			s.t.pinUnit(&units[i])
		}
	}
	return units, partition(spans), nil
}

// unitAbbrev returns an abbreviation table holding the declaration of u's first
// DIE: reading every unit's DIE at load need not parse every table whole.
func unitAbbrev(s *sections, u *unit) (*abbrevTable, error) {
	r := &secReader{b: s.data[secInfo][:u.end], pos: int(u.off) + int(u.dieOff), order: s.order}
	code := uint64(uint32(r.uleb()))
	if r.err != nil {
		return nil, fmt.Errorf("first entry: %w", r.err)
	}
	b := s.data[secAbbrev]
	if u.abbrev >= uint64(len(b)) {
		return nil, fmt.Errorf("abbreviation table at %#x past the end of .debug_abbrev", u.abbrev)
	}
	ar := &secReader{b: b, pos: int(u.abbrev), order: s.order}
	// The table's end is found by reading it: what is compressed is decompressed a
	// few kilobytes ahead of the reading.
	var ready uint64
	ahead := func() error {
		if uint64(ar.pos)+256 <= ready {
			return nil
		}
		ready = uint64(ar.pos) + 4096
		return s.need(secAbbrev, uint64(ar.pos), ready)
	}
	at := -1
	for {
		if err := ahead(); err != nil {
			return nil, err
		}
		pos := ar.pos
		c := uint64(uint32(ar.uleb()))
		if ar.err != nil || c == 0 {
			break
		}
		if c == code {
			at = pos // the last declaration of a code counts
		}
		ar.uleb()
		ar.u8()
		for ar.err == nil {
			if err := ahead(); err != nil {
				return nil, err
			}
			attr, form := ar.uleb(), ar.uleb()
			if attr == 0 && form == 0 {
				break
			}
			if form == formImplicitConst {
				ar.sleb()
			}
		}
	}
	u.abbrevEnd = uint64(ar.pos)
	if ar.err != nil {
		return nil, fmt.Errorf("abbreviation table at %#x: %w", u.abbrev, ar.err)
	}
	t := &abbrevTable{}
	if at < 0 || code == 0 {
		return t, nil // readEntry reports the unknown code, or reads a null entry
	}
	var specs []attrSpec
	ar.pos, ar.err = at, nil
	_, a, err := readAbbrev(ar, &specs)
	if err != nil {
		return nil, fmt.Errorf("abbreviation table at %#x: %w", u.abbrev, err)
	}
	t.sparse = map[uint64]abbrev{code: a}
	return t, nil
}

// checkLineProgram checks the header of the line program at off before debug/dwarf
// reads it: its length within the section, its version, and the DWARF 5 counts.
func checkLineProgram(line []byte, off int64) error {
	if off < 0 || off > int64(len(line)) {
		return fmt.Errorf("offset %#x out of range", off)
	}
	r := &secReader{b: line, pos: int(off), order: lineByteOrder(line[off:])}
	n, _ := r.unitLength()
	if r.err != nil || n > uint64(len(line)-r.pos) {
		return fmt.Errorf("line program at %#x: length %#x exceeds the section", off, n)
	}
	if v := r.u16(); r.err != nil || v < 2 || v > 5 {
		return fmt.Errorf("line program at %#x: unknown version %d", off, v)
	}
	return checkLineHeader(line, off)
}

// arangeSet is one set of .debug_aranges: the unit's address size, and its ranges.
type arangeSet struct {
	asize  uint8
	ranges [][2]uint64
}

// parseAranges reads .debug_aranges: the ranges of each unit it lists, by the unit's
// offset in .debug_info. It returns nil when the section is absent or cannot be
// trusted: malformed (the walk of the units checks the offsets and address sizes).
func parseAranges(s *sections) map[uint64]*arangeSet {
	b := s.data[secAranges]
	if len(b) == 0 {
		return nil
	}
	sets := map[uint64]*arangeSet{}
	r := &secReader{b: b, order: s.order}
	for r.pos < len(b) {
		start := r.pos
		n, is64 := r.unitLength()
		if r.err != nil || n > uint64(len(b)-r.pos) {
			return nil
		}
		end := r.pos + int(n)
		if r.u16() != 2 {
			return nil
		}
		var infoOff uint64
		if is64 {
			infoOff = r.u64()
		} else {
			infoOff = uint64(r.u32())
		}
		asize, seg := r.u8(), r.u8()
		if r.err != nil || seg != 0 || asize != 1 && asize != 2 && asize != 4 && asize != 8 || r.pos > end {
			return nil
		}
		set := sets[infoOff]
		if set == nil {
			set = &arangeSet{asize: asize}
			sets[infoOff] = set
		} else if set.asize != asize {
			return nil
		}
		// Tuples start at a multiple of their size from the set's start.
		tuple := 2 * int(asize)
		r.pos += (tuple - (r.pos-start)%tuple) % tuple
		for r.pos+tuple <= end {
			lo, length := r.uint(int(asize)), r.uint(int(asize))
			if lo == 0 && length == 0 {
				break
			}
			if lo != 0 && lo+length > lo {
				set.ranges = append(set.ranges, [2]uint64{lo, lo + length})
			}
		}
		if r.err != nil {
			return nil
		}
		r.pos = end
	}
	return sets
}

// appendSpans appends the addresses the unit's code takes: its line sequences and
// its functions.
func (t *unitTable) appendSpans(spans []unitSpan, unit uint32) []unitSpan {
	start, open := uint64(0), false
	for i, r := range t.rows {
		switch {
		case r.file == endMarker:
			if open && r.addr > start {
				spans = append(spans, unitSpan{lo: start, hi: r.addr, unit: unit})
			}
			open = false
		case !open:
			start, open = r.addr, true
		}
		if open && i == len(t.rows)-1 {
			spans = append(spans, unitSpan{lo: start, hi: r.addr + 1, unit: unit})
		}
	}
	for _, r := range t.ranges {
		spans = append(spans, unitSpan{lo: r.lo, hi: r.hi, unit: unit})
	}
	return spans
}

// partition turns spans that may overlap into disjoint ones, by address: where
// several units claim an address, the one whose span starts last (of those
// starting together, the later unit) takes it, the innermost of nested claims.
// Adjacent spans of one unit merge.
func partition(spans []unitSpan) []unitSpan {
	slices.SortFunc(spans, func(a, b unitSpan) int {
		if c := cmp.Compare(a.lo, b.lo); c != 0 {
			return c
		}
		return cmp.Compare(a.unit, b.unit)
	})
	bounds := make([]uint64, 0, 2*len(spans))
	for _, s := range spans {
		bounds = append(bounds, s.lo, s.hi)
	}
	slices.Sort(bounds)
	bounds = slices.Compact(bounds)
	var (
		out    []unitSpan
		active spanHeap
		next   int
	)
	for k := 0; k+1 < len(bounds); k++ {
		x := bounds[k]
		for next < len(spans) && spans[next].lo <= x {
			heap.Push(&active, spans[next])
			next++
		}
		for len(active) > 0 && active[0].hi <= x {
			heap.Pop(&active)
		}
		if len(active) == 0 {
			continue
		}
		owner := active[0].unit
		if n := len(out); n > 0 && out[n-1].unit == owner && out[n-1].hi == x {
			out[n-1].hi = bounds[k+1]
			continue
		}
		out = append(out, unitSpan{lo: x, hi: bounds[k+1], unit: owner})
	}
	return slices.Clip(out)
}

// spanHeap orders the spans holding an address: the one starting last on top.
type spanHeap []unitSpan

func (h spanHeap) Len() int { return len(h) }
func (h spanHeap) Less(i, j int) bool {
	if h[i].lo != h[j].lo {
		return h[i].lo > h[j].lo
	}
	return h[i].unit > h[j].unit
}
func (h spanHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *spanHeap) Push(x any)   { *h = append(*h, x.(unitSpan)) }
func (h *spanHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
