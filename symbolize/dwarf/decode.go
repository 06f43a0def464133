package dwarf

import (
	"cmp"
	"debug/dwarf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"slices"
	"strings"
	"unsafe"
)

// unitTable is one unit decoded: its line rows, functions and inlined calls. It is
// immutable once built; its strings are copies, not views of the sections.
type unitTable struct {
	rows   []row // by address
	files  []string
	names  []string
	nodes  []node    // functions and their inlined calls, each tree in preorder
	ranges []pcRange // the nodes' address ranges
	funcs  []span    // the ranges of outermost functions, by start address
}

type row struct {
	addr       uint64
	file, line uint32 // file is endMarker after the end of a sequence
}

type node struct {
	rangeOff, rangeEnd uint32 // into unitTable.ranges
	name               uint32 // into unitTable.names, or noIndex
	// callFile and callLine are where an inlined call sits in its caller.
	callFile, callLine uint32
	end                uint32 // one past the last node of this node's subtree
}

type pcRange struct{ lo, hi uint64 }

type span struct {
	pcRange
	node uint32
}

// dieName is what naming a function needs from one DIE; the strings are views of
// the sections, valid while the decoder runs.
type dieName struct {
	name, linkage []byte
	ref           uint64 // abstract origin or specification, 0 for none
}

type pendingName struct {
	node uint32
	die  uint64
}

// decoder decodes one unit. References to DIEs in other units (LTO's abstract
// origins, dwz's partial units) are read where they lie, through those units'
// abbreviations.
type decoder struct {
	s        *sections
	units    []unit
	t        *unitTable
	fileIdx  map[string]uint32
	nameIdx  map[string]uint32
	dies     map[uint64]dieName // DIEs named, of this unit and those referenced
	resolved map[uint64]uint32  // a DIE's final name index
	pending  []pendingName
	others   map[int]*unitCtx // units references led to
	rangeBuf [][2]uint64
}

// decodeUnit decodes unit i.
func decodeUnit(s *sections, units []unit, i int) (*unitTable, error) {
	u := &units[i]
	if err := s.needUnit(u); err != nil {
		return nil, err
	}
	abbrevs, err := parseAbbrevs(s, u.abbrev)
	if err != nil {
		return nil, err
	}
	c, cu, err := openUnit(s, u, abbrevs)
	if err != nil {
		return nil, err
	}
	dc := &decoder{
		s:        s,
		units:    units,
		t:        &unitTable{},
		fileIdx:  map[string]uint32{},
		nameIdx:  map[string]uint32{},
		dies:     map[uint64]dieName{},
		resolved: map[uint64]uint32{},
		others:   map[int]*unitCtx{i: c},
	}
	if cu.tag != dwarf.TagCompileUnit && cu.tag != dwarf.TagPartialUnit {
		return dc.t, nil
	}
	files, err := dc.lineTable(c, cu)
	if err != nil {
		return nil, fmt.Errorf("line table: %w", err)
	}
	if err := dc.walk(c, cu, files); err != nil {
		return nil, err
	}
	dc.finish()
	return dc.t, nil
}

// lineTable appends the unit's line rows and returns its file table. The line program is run by debug/dwarf's LineReader, over a
// debug/dwarf Data made for it: a single empty unit of the right address size
// beside the real .debug_line and string sections (see lineData).
func (dc *decoder) lineTable(c *unitCtx, cu *entry) (*fileTable, error) {
	line := dc.s.data[secLine]
	if cu.stmtList.kind != valInt || line == nil {
		return nil, nil // a nil table names no file
	}
	off := int64(cu.stmtList.u)
	if _, err := dc.s.needLine(cu.stmtList.u); err != nil {
		return nil, err
	}
	if err := checkLineHeader(line, off); err != nil {
		return nil, err
	}
	d, cuEntry, err := lineData(dc.s, c.u, off, cu.compDir)
	if err != nil {
		return nil, err
	}
	lr, err := d.LineReader(cuEntry)
	if err != nil || lr == nil {
		return nil, err
	}
	// DWARF 5 makes every relative directory relative to the compilation directory,
	// but debug/dwarf joins only directory 0, which is the compilation directory
	// itself; DWARF 4 file tables are joined right. A DWARF 5 table is the one whose
	// file 0 exists.
	compDir := string(cu.compDir.str())
	v5 := len(lr.Files()) > 0 && lr.Files()[0] != nil
	cleanComp := path.Clean(compDir)
	byFile := map[*dwarf.LineFile]uint32{}
	fileOf := func(f *dwarf.LineFile) uint32 {
		if f == nil {
			return noIndex
		}
		if i, ok := byFile[f]; ok {
			return i
		}
		name := f.Name
		if v5 && compDir != "" && name != "" && !path.IsAbs(name) && !strings.HasPrefix(name, cleanComp+"/") {
			name = path.Join(compDir, name)
		}
		i := dc.file(name)
		byFile[f] = i
		return i
	}
	var (
		e        dwarf.LineEntry
		seqStart = len(dc.t.rows)
		skipSeq  bool
	)
	for {
		if err := lr.Next(&e); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, err
		}
		rows := dc.t.rows
		if len(rows) == seqStart {
			// A sequence at address 0 is code the linker discarded (its relocations
			// resolved to 0); executables and libraries have no code there, and the
			// rows would shadow each other.
			skipSeq = e.Address == 0
		}
		if skipSeq {
			if e.EndSequence {
				seqStart = len(rows)
			}
			continue
		}
		if e.EndSequence {
			dc.t.rows = append(rows, row{addr: e.Address, file: endMarker})
			seqStart = len(dc.t.rows)
			continue
		}
		r := row{addr: e.Address, file: fileOf(e.File), line: clampU32(e.Line)}
		// Several rows at one address: the last one describes the instruction there,
		// which is also the one binutils keeps.
		if n := len(rows); n > seqStart && rows[n-1].addr == r.addr {
			rows[n-1] = r
			continue
		}
		dc.t.rows = append(rows, r)
	}
	// The file table lists every header the unit included; only the files rows
	// name are interned now, those of inlined calls when a call names them.
	return &fileTable{files: lr.Files(), of: fileOf}, nil
}

// fileTable maps a unit's file numbers to the unit table's files, interning each
// file when first used.
type fileTable struct {
	files []*dwarf.LineFile
	of    func(*dwarf.LineFile) uint32
}

func (ft *fileTable) index(i int64) uint32 {
	if ft == nil || i < 0 || i >= int64(len(ft.files)) {
		return noIndex
	}
	return ft.of(ft.files[i])
}

// lineData makes the debug/dwarf Data a LineReader runs on: .debug_line and the
// string sections as they are, and for .debug_info one empty DWARF 4 unit whose
// header gives the address size, in the file's byte order, which is all a line
// program takes from its unit.
func lineData(s *sections, u *unit, stmtList int64, compDir value) (*dwarf.Data, *dwarf.Entry, error) {
	info := make([]byte, 12)
	s.order.PutUint32(info, 8) // version, abbreviation offset, address size and a null entry
	s.order.PutUint16(info[4:], 4)
	info[10] = u.asize
	d, err := dwarf.New([]byte{0}, nil, nil, info, s.data[secLine], nil, nil, s.data[secStr])
	if err != nil {
		return nil, nil, err
	}
	if ls := s.data[secLineStr]; ls != nil {
		if err := d.AddSection(".debug_line_str", ls); err != nil {
			return nil, nil, err
		}
	}
	fields := []dwarf.Field{{Attr: dwarf.AttrStmtList, Val: stmtList, Class: dwarf.ClassLinePtr}}
	if compDir.kind == valString {
		fields = append(fields, dwarf.Field{Attr: dwarf.AttrCompDir, Val: string(compDir.s), Class: dwarf.ClassString})
	}
	return d, &dwarf.Entry{Offset: 11, Tag: dwarf.TagCompileUnit, Field: fields}, nil
}

// level is one level of DIE nesting during the walk.
type level struct {
	enclosing uint32 // the innermost function node around this level, or noIndex
	opened    uint32 // the node this level's parent DIE created, or noIndex
}

// walk records the unit's functions and inlined calls, in preorder.
func (dc *decoder) walk(c *unitCtx, cu *entry, files *fileTable) error {
	if !cu.children {
		return nil
	}
	off, err := c.readEntry(cu.off, &entry{})
	if err != nil {
		return err
	}
	stack := []level{{enclosing: noIndex, opened: noIndex}}
	var e entry
	// Entries that end before the unit closes what it opened are a truncated unit:
	// finish closes the nodes it left open.
	for len(stack) > 0 && off < c.u.end {
		next, err := c.readEntry(off, &e)
		if err != nil {
			return err
		}
		top := stack[len(stack)-1]
		if e.tag == 0 {
			if top.opened != noIndex {
				dc.t.nodes[top.opened].end = uint32(len(dc.t.nodes))
			}
			stack = stack[:len(stack)-1]
			off = next
			continue
		}
		switch e.tag {
		case dwarf.TagSubprogram, dwarf.TagInlinedSubroutine:
			inlined := e.tag == dwarf.TagInlinedSubroutine
			if !inlined {
				dc.dies[e.off] = nameOf(&e)
			}
			var ranges [][2]uint64
			if !inlined || top.enclosing != noIndex {
				if ranges, err = c.ranges(&e, cu, dc.rangeBuf[:0]); err != nil {
					return fmt.Errorf("ranges of entry at %#x: %w", e.off, err)
				}
				dc.rangeBuf = ranges
			}
			n, ok := dc.addNode(&e, ranges, inlined, files)
			if !ok {
				// Declarations and abstract instances have no code; what they hold is
				// reached by reference from the instances that do.
				if e.children {
					if next, err = c.skipChildren(&e, next); err != nil {
						return err
					}
				}
				off = next
				continue
			}
			if e.children {
				stack = append(stack, level{enclosing: n, opened: n})
			} else {
				dc.t.nodes[n].end = n + 1
			}
		case dwarf.TagLexDwarfBlock, dwarf.TagNamespace, dwarf.TagModule, dwarf.TagTryDwarfBlock, dwarf.TagCatchDwarfBlock:
			// Functions and inlined calls nest inside these.
			if e.children {
				stack = append(stack, level{enclosing: top.enclosing, opened: noIndex})
			}
		default:
			// Types, variables and parameters: member function declarations inside
			// classes are reached by reference when a definition names them.
			if e.children {
				if next, err = c.skipChildren(&e, next); err != nil {
					return err
				}
			}
		}
		off = next
	}
	return nil
}

// skipChildren returns the offset past the children of e, whose own entry ends at
// next: its DW_AT_sibling where that points forward inside the unit, else past the
// subtree read entry by entry.
func (c *unitCtx) skipChildren(e *entry, next uint64) (uint64, error) {
	if e.sibling.kind == valOffset && e.sibling.u >= next && e.sibling.u < c.u.end {
		return e.sibling.u, nil
	}
	var child entry
	for depth := 1; depth > 0 && next < c.u.end; {
		n, err := c.readEntry(next, &child)
		if err != nil {
			return 0, err
		}
		switch {
		case child.tag == 0:
			depth--
		case child.children:
			if child.sibling.kind == valOffset && child.sibling.u >= n && child.sibling.u < c.u.end {
				n = child.sibling.u
			} else {
				depth++
			}
		}
		next = n
	}
	return next, nil
}

// addNode records a function or inlined call with code, returning false when it has none.
func (dc *decoder) addNode(e *entry, ranges [][2]uint64, inlined bool, files *fileTable) (uint32, bool) {
	t := dc.t
	off := len(t.ranges)
	for _, rg := range ranges {
		// Empty and inverted ranges are discarded code or tombstones; ranges at 0 are
		// discarded code whose relocations resolved to 0.
		if rg[0] == 0 || rg[0] >= rg[1] {
			continue
		}
		t.ranges = append(t.ranges, pcRange{lo: rg[0], hi: rg[1]})
	}
	if len(t.ranges) == off || len(t.nodes) >= math.MaxUint32-2 {
		t.ranges = t.ranges[:off]
		return 0, false
	}
	n := uint32(len(t.nodes))
	nd := node{rangeOff: uint32(off), rangeEnd: uint32(len(t.ranges)), name: noIndex, callFile: noIndex}
	if inlined {
		if e.callFile.kind == valInt {
			nd.callFile = files.index(int64(e.callFile.u))
		}
		if e.callLine.kind == valInt {
			nd.callLine = clampU32(int(int64(e.callLine.u)))
		}
	} else {
		for _, rg := range t.ranges[off:] {
			t.funcs = append(t.funcs, span{pcRange: rg, node: n})
		}
	}
	t.nodes = append(t.nodes, nd)
	dc.pending = append(dc.pending, pendingName{node: n, die: e.off})
	if inlined {
		dc.dies[e.off] = nameOf(e)
	}
	return n, true
}

func nameOf(e *entry) dieName {
	n := dieName{name: e.name.str()}
	switch {
	case e.linkage.kind == valString:
		n.linkage = e.linkage.s
	case e.mipsLinkage.kind == valString:
		n.linkage = e.mipsLinkage.s
	}
	switch {
	case e.abstractOrigin.kind == valOffset:
		n.ref = e.abstractOrigin.u
	case e.specification.kind == valOffset:
		n.ref = e.specification.u
	}
	return n
}

// die returns the naming attributes of the DIE at off, reading it if the walk did
// not, in whichever unit holds it.
func (dc *decoder) die(off uint64) dieName {
	if n, ok := dc.dies[off]; ok {
		return n
	}
	var n dieName
	if c := dc.unitAt(off); c != nil {
		var e entry
		if _, err := c.readEntry(off, &e); err == nil {
			n = nameOf(&e)
		}
	}
	dc.dies[off] = n
	return n
}

// unitAt returns the unit whose entries hold off, opened, or nil.
func (dc *decoder) unitAt(off uint64) *unitCtx {
	i, found := slices.BinarySearchFunc(dc.units, off, func(u unit, off uint64) int { return cmp.Compare(u.off, off) })
	if !found {
		i--
	}
	if i < 0 || off < dc.units[i].off+uint64(dc.units[i].dieOff) || off >= dc.units[i].end {
		return nil
	}
	if c, ok := dc.others[i]; ok {
		return c
	}
	var c *unitCtx
	if err := dc.s.needUnit(&dc.units[i]); err != nil {
		dc.others[i] = nil
		return nil
	}
	if abbrevs, err := parseAbbrevs(dc.s, dc.units[i].abbrev); err == nil {
		c, _, _ = openUnit(dc.s, &dc.units[i], abbrevs)
	}
	dc.others[i] = c
	return c
}

// name resolves the function name of the DIE at off: a linkage name anywhere along
// its abstract-origin and specification chain, else the first plain name, the way
// binutils names functions.
func (dc *decoder) name(off uint64) uint32 {
	if i, ok := dc.resolved[off]; ok {
		return i
	}
	var plain, linkage []byte
	cur := off
	for range maxRefChain {
		n := dc.die(cur)
		if len(plain) == 0 {
			plain = n.name
		}
		if len(n.linkage) > 0 {
			linkage = n.linkage
			break
		}
		if n.ref == 0 || n.ref == cur {
			break
		}
		cur = n.ref
	}
	i := uint32(noIndex)
	switch {
	case len(linkage) > 0:
		i = dc.intern(linkage) | linkageBit
	case len(plain) > 0:
		i = dc.intern(plain)
	}
	dc.resolved[off] = i
	return i
}

func (dc *decoder) intern(b []byte) uint32 {
	if i, ok := dc.nameIdx[string(b)]; ok {
		return i
	}
	if len(dc.t.names) >= linkageBit-1 {
		return noIndex &^ linkageBit
	}
	s := string(b)
	i := uint32(len(dc.t.names))
	dc.t.names = append(dc.t.names, s)
	dc.nameIdx[s] = i
	return i
}

func (dc *decoder) file(s string) uint32 {
	if i, ok := dc.fileIdx[s]; ok {
		return i
	}
	i := uint32(len(dc.t.files))
	dc.t.files = append(dc.t.files, s)
	dc.fileIdx[s] = i
	return i
}

func clampU32(v int) uint32 {
	switch {
	case v < 0:
		return 0
	case uint64(v) > math.MaxUint32-2:
		return math.MaxUint32 - 2
	default:
		return uint32(v)
	}
}

// finish names the nodes, closes what truncated input left open, and sorts.
func (dc *decoder) finish() {
	t := dc.t
	for _, p := range dc.pending {
		t.nodes[p.node].name = dc.name(p.die)
	}
	for i := range t.nodes {
		if t.nodes[i].end <= uint32(i) {
			t.nodes[i].end = uint32(len(t.nodes))
		}
	}
	t.rows = mergeRows(t.rows)
	slices.SortStableFunc(t.funcs, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	// Exact-size copies: appending left up to twice the room, and the table lives
	// as long as the cache keeps it.
	t.funcs = slices.Clone(t.funcs)
	t.nodes = slices.Clone(t.nodes)
	t.ranges = slices.Clone(t.ranges)
	t.files = slices.Clone(t.files)
	t.names = slices.Clone(t.names)
}

// mergeRows sorts the rows of a unit's sequences by address and drops those that
// change nothing. Sequences may interleave; where one ends at the address the next
// starts at, the start wins.
func mergeRows(rows []row) []row {
	rank := func(r row) int {
		if r.file == endMarker {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(rows, func(a, b row) int {
		if c := cmp.Compare(a.addr, b.addr); c != 0 {
			return c
		}
		return cmp.Compare(rank(a), rank(b))
	})
	out := rows[:0]
	for _, r := range rows {
		if n := len(out); n > 0 {
			prev := out[n-1]
			if prev.file == endMarker && r.addr == prev.addr {
				out[n-1] = r // an end marker the next row overrides
				continue
			}
			if prev.file == r.file && prev.line == r.line {
				continue // same line as the row before: nothing changes at this address
			}
		}
		if r.file == endMarker && len(out) == 0 {
			continue
		}
		out = append(out, r)
	}
	return slices.Clone(out)
}

// lookup returns the frames at addr, innermost first, or nil when the unit covers
// addr with neither a line nor a function.
func (t *unitTable) lookup(addr uint64) []Frame {
	file, line, hasLine := t.line(addr)
	var buf [8]uint32
	chain := t.chain(addr, buf[:0])
	if len(chain) == 0 {
		if !hasLine {
			return nil
		}
		return []Frame{{File: file, Line: line}}
	}
	frames := make([]Frame, len(chain))
	for i := range frames {
		n := t.nodes[chain[len(chain)-1-i]]
		f := &frames[i]
		f.Name = str(t.names, n.name&^linkageBit)
		f.Linkage = n.name != noIndex && n.name&linkageBit != 0
		f.Entry = t.ranges[n.rangeOff].lo
		if i == 0 {
			f.File, f.Line = file, line
			continue
		}
		// The caller's position is where the frame inside it was inlined.
		inner := t.nodes[chain[len(chain)-i]]
		f.File, f.Line = str(t.files, inner.callFile), int64(inner.callLine)
	}
	return frames
}

func str(list []string, i uint32) string {
	if int(i) < len(list) {
		return list[i]
	}
	return ""
}

// line returns the line table's row for addr.
func (t *unitTable) line(addr uint64) (file string, line int64, ok bool) {
	i, found := slices.BinarySearchFunc(t.rows, addr, func(r row, a uint64) int { return cmp.Compare(r.addr, a) })
	if !found {
		i--
	}
	if i < 0 || t.rows[i].file == endMarker {
		return "", 0, false
	}
	r := t.rows[i]
	return str(t.files, r.file), int64(r.line), true
}

// chain returns the nodes covering addr, outermost first.
func (t *unitTable) chain(addr uint64, chain []uint32) []uint32 {
	i, found := slices.BinarySearchFunc(t.funcs, addr, func(s span, a uint64) int { return cmp.Compare(s.lo, a) })
	if found {
		// Several ranges may start at addr; take the last so the backward scan sees all.
		for i+1 < len(t.funcs) && t.funcs[i+1].lo == addr {
			i++
		}
	} else {
		i--
	}
	top := uint32(noIndex)
	for j := i; j >= 0 && j > i-maxOverlap; j-- {
		if s := t.funcs[j]; addr >= s.lo && addr < s.hi {
			top = s.node
			break
		}
	}
	if top == noIndex {
		return chain
	}
	chain = append(chain, top)
	n, end := top, t.nodes[top].end
	for c := n + 1; c < end && int(c) < len(t.nodes); {
		if t.covers(c, addr) {
			chain = append(chain, c)
			n, end = c, t.nodes[c].end
			c++
			continue
		}
		next := t.nodes[c].end
		if next <= c {
			next = c + 1
		}
		c = next
	}
	return chain
}

func (t *unitTable) covers(n uint32, addr uint64) bool {
	nd := t.nodes[n]
	for _, r := range t.ranges[nd.rangeOff:nd.rangeEnd] {
		if addr >= r.lo && addr < r.hi {
			return true
		}
	}
	return false
}

// Sizes of what a unitTable holds.
const (
	stringHeader = int64(unsafe.Sizeof(""))
	// unitOverhead is the table, its cache entry and its slot in its Table's map.
	unitOverhead = int64(unsafe.Sizeof(unitTable{})) + int64(unsafe.Sizeof(cached{})) + 32
)

// sizeBytes estimates the memory the table holds, strings rounded to the
// allocator's granule.
func (t *unitTable) sizeBytes() int64 {
	n := unitOverhead +
		int64(cap(t.rows))*int64(unsafe.Sizeof(row{})) +
		int64(cap(t.nodes))*int64(unsafe.Sizeof(node{})) +
		int64(cap(t.ranges))*int64(unsafe.Sizeof(pcRange{})) +
		int64(cap(t.funcs))*int64(unsafe.Sizeof(span{}))
	for _, list := range [][]string{t.files, t.names} {
		n += int64(cap(list)) * stringHeader
		for _, s := range list {
			n += int64(len(s)+7) &^ 7
		}
	}
	return n
}

// byteOrder tells the byte order of DWARF sections from the version of the first
// unit of .debug_info, as debug/dwarf does: a small number that reads as one in
// only one order.
func byteOrder(info []byte) (binary.ByteOrder, error) {
	if len(info) < 6 {
		return nil, errors.New(".debug_info too short")
	}
	at := 4
	if info[0] == 0xff && info[1] == 0xff && info[2] == 0xff && info[3] == 0xff {
		if len(info) < 14 {
			return nil, errors.New(".debug_info too short")
		}
		at = 12
	}
	x, y := info[at], info[at+1]
	switch {
	case x == 0 && y == 0:
		return nil, errors.New(".debug_info: unsupported version 0")
	case x == 0:
		return binary.BigEndian, nil
	case y == 0:
		return binary.LittleEndian, nil
	}
	return nil, errors.New(".debug_info: cannot determine byte order")
}
