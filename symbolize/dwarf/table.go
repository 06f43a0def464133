package dwarf

import (
	"bytes"
	"cmp"
	"debug/dwarf"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"slices"
	"strings"
)

// ErrNoDWARF means the file carries no .debug_info: stripped, or never built with -g.
var ErrNoDWARF = errors.New("no dwarf debug information")

// Frame is one source-level frame at an address.
type Frame struct {
	// Name is the function as the compiler recorded it: the linkage (mangled) name
	// when there is one, else DW_AT_name. It is empty when the address has a line
	// but no function, as in assembly files.
	Name string
	// Linkage says Name is a linkage name. A plain DW_AT_name of C++ code lacks
	// namespaces and parameters, and a caller with the symbol table at hand may
	// prefer the symbol's name, as binutils does.
	Linkage bool
	// Entry is the function's (or the inlined copy's) first address.
	Entry uint64
	File  string // "" when unknown
	Line  int64  // 0 when unknown
}

const (
	// noIndex stands for an absent file or name.
	noIndex = math.MaxUint32
	// linkageBit marks a node's name index as a linkage name.
	linkageBit = 1 << 31
	// endMarker in row.file closes a line sequence: no line covers its address.
	endMarker = math.MaxUint32 - 1
	// maxRefChain bounds how many abstract-origin and specification links a name
	// lookup follows, so that a cycle in hostile input ends.
	maxRefChain = 8
	// maxOverlap bounds how far a lookup looks back among functions starting before
	// an address for one that still covers it: top-level functions do not overlap in
	// sane output, and hostile output must not make a lookup linear.
	maxOverlap = 8
)

// Table maps addresses to frames. It is immutable once built and safe for
// concurrent lookups.
type Table struct {
	rows   []row // line table rows of every unit, by address
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
	rangeOff, rangeEnd uint32 // into Table.ranges
	name               uint32 // into Table.names, or noIndex
	// callFile and callLine are where an inlined call sits in its caller.
	callFile, callLine uint32
	end                uint32 // one past the last node of this node's subtree
}

type pcRange struct{ lo, hi uint64 }

type span struct {
	pcRange
	node uint32
}

// HasDWARF reports whether f carries debug information this package can read.
func HasDWARF(f *elf.File) bool {
	s := section(f, "info")
	return s != nil && s.Type != elf.SHT_NOBITS && s.Size > 0
}

// sections are those a lookup needs; location lists, frame tables, macros and
// type units are left unread.
var sections = []string{"abbrev", "info", "str", "line", "ranges", "addr", "line_str", "str_offsets", "rnglists"}

func section(f *elf.File, name string) *elf.Section {
	if s := f.Section(".debug_" + name); s != nil {
		return s
	}
	return f.Section(".zdebug_" + name)
}

// Load reads the DWARF sections of f and decodes them. maxBytes bounds the size of
// the sections read, uncompressed; 0 means no bound. The sections of relocatable
// objects (ET_REL) are used as they are, without applying relocations: sonde reads
// executables and shared libraries.
func Load(f *elf.File, maxBytes int64) (t *Table, err error) {
	// debug/dwarf and debug/elf trust lengths and offsets in the input; a hostile file
	// has made them panic before, and must cost an error, not the agent.
	defer func() {
		if p := recover(); p != nil {
			t, err = nil, fmt.Errorf("corrupt dwarf: %v", p)
		}
	}()
	if !HasDWARF(f) {
		return nil, ErrNoDWARF
	}
	data := make(map[string][]byte, len(sections))
	var total int64
	for _, name := range sections {
		s := section(f, name)
		if s == nil || s.Type == elf.SHT_NOBITS {
			continue
		}
		r := s.Open() // learns the uncompressed size of a .zdebug section
		size := int64(s.Size)
		if size < 0 || (maxBytes > 0 && total+size > maxBytes) {
			return nil, fmt.Errorf("dwarf sections exceed %d bytes at %s (%d bytes)", maxBytes, s.Name, s.Size)
		}
		total += size
		// Grow with what the section really yields rather than allocating the size a
		// header claims: a truncated file or a bogus compression header stays cheap.
		var buf bytes.Buffer
		if _, err := buf.ReadFrom(io.LimitReader(r, size)); err != nil {
			return nil, fmt.Errorf("read %s: %w", s.Name, err)
		}
		if int64(buf.Len()) != size {
			return nil, fmt.Errorf("read %s: %d of %d bytes", s.Name, buf.Len(), size)
		}
		data[name] = buf.Bytes()
	}
	d, err := dwarf.New(data["abbrev"], nil, nil, data["info"], data["line"], nil, data["ranges"], data["str"])
	if err != nil {
		return nil, fmt.Errorf("parse dwarf: %w", err)
	}
	for _, name := range []string{"addr", "line_str", "str_offsets", "rnglists"} {
		if b := data[name]; b != nil {
			if err := d.AddSection(".debug_"+name, b); err != nil {
				return nil, fmt.Errorf("parse dwarf .debug_%s: %w", name, err)
			}
		}
	}
	return New(d, data["line"])
}

// New decodes d into a Table. line is the .debug_line section d was made from: the
// line headers are checked against it before debug/dwarf, which trusts their counts,
// reads them.
func New(d *dwarf.Data, line []byte) (t *Table, err error) {
	defer func() {
		if p := recover(); p != nil {
			t, err = nil, fmt.Errorf("corrupt dwarf: %v", p)
		}
	}()
	dc := &decoder{
		d:        d,
		line:     line,
		t:        &Table{},
		fileIdx:  map[string]uint32{},
		nameIdx:  map[string]uint32{},
		dies:     map[dwarf.Offset]dieName{},
		resolved: map[dwarf.Offset]uint32{},
		seek:     d.Reader(),
	}
	if err := dc.run(); err != nil {
		return nil, err
	}
	dc.finish()
	return dc.t, nil
}

// dieName is what naming a function needs from one DIE.
type dieName struct {
	name, linkage string
	ref           dwarf.Offset // abstract origin or specification, 0 for none
}

type pendingName struct {
	node uint32
	die  dwarf.Offset
}

type decoder struct {
	d        *dwarf.Data
	line     []byte // raw .debug_line, for checkLineHeader
	t        *Table
	fileIdx  map[string]uint32
	nameIdx  map[string]uint32
	dies     map[dwarf.Offset]dieName // subprograms seen, for references to them
	resolved map[dwarf.Offset]uint32  // a DIE's final name index
	pending  []pendingName
	seek     *dwarf.Reader // for references to DIEs the walk skipped
}

// maxPadding bounds the run of null entries between units. Producers pad a unit
// with a few zero bytes at most; debug/dwarf reads an unterminated LEB128 as a null
// entry without moving on, so a file ending in one would otherwise yield nulls forever.
const maxPadding = 4096

func (dc *decoder) run() error {
	r := dc.d.Reader()
	nulls := 0
	for {
		cu, err := r.Next()
		if err != nil {
			return fmt.Errorf("read dwarf entries: %w", err)
		}
		if cu == nil {
			return nil
		}
		if cu.Tag == 0 {
			if nulls++; nulls > maxPadding {
				return fmt.Errorf("read dwarf entries: more than %d null entries in a row", maxPadding)
			}
			continue
		}
		nulls = 0
		if cu.Tag != dwarf.TagCompileUnit && cu.Tag != dwarf.TagPartialUnit {
			r.SkipChildren()
			continue
		}
		files, err := dc.lineTable(cu)
		if err != nil {
			return fmt.Errorf("line table of unit at %#x: %w", cu.Offset, err)
		}
		if err := dc.unit(r, cu, files); err != nil {
			return fmt.Errorf("unit at %#x: %w", cu.Offset, err)
		}
	}
}

// lineTable appends the unit's line rows and returns its file table as indexes
// into Table.files.
func (dc *decoder) lineTable(cu *dwarf.Entry) ([]uint32, error) {
	if off, ok := cu.Val(dwarf.AttrStmtList).(int64); ok {
		if err := checkLineHeader(dc.line, off); err != nil {
			return nil, err
		}
	}
	lr, err := dc.d.LineReader(cu)
	if err != nil || lr == nil {
		return nil, err
	}
	// DWARF 5 makes every relative directory relative to the compilation directory,
	// but debug/dwarf joins only directory 0, which is the compilation directory
	// itself; DWARF 4 file tables are joined right. A DWARF 5 table is the one whose
	// file 0 exists.
	compDir, _ := cu.Val(dwarf.AttrCompDir).(string)
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
	files := lr.Files()
	idx := make([]uint32, len(files))
	for i, f := range files {
		idx[i] = fileOf(f)
	}
	return idx, nil
}

// level is one level of DIE nesting during the walk.
type level struct {
	enclosing uint32 // the innermost function node around this level, or noIndex
	opened    uint32 // the node this level's parent DIE created, or noIndex
}

func (dc *decoder) unit(r *dwarf.Reader, cu *dwarf.Entry, files []uint32) error {
	if !cu.Children {
		return nil
	}
	stack := []level{{enclosing: noIndex, opened: noIndex}}
	for len(stack) > 0 {
		e, err := r.Next()
		if err != nil {
			return err
		}
		if e == nil {
			return errors.New("entries end inside a unit")
		}
		top := stack[len(stack)-1]
		if e.Tag == 0 {
			if top.opened != noIndex {
				dc.t.nodes[top.opened].end = uint32(len(dc.t.nodes))
			}
			stack = stack[:len(stack)-1]
			continue
		}
		switch e.Tag {
		case dwarf.TagSubprogram, dwarf.TagInlinedSubroutine:
			inlined := e.Tag == dwarf.TagInlinedSubroutine
			if e.Tag == dwarf.TagSubprogram {
				dc.dies[e.Offset] = nameOf(e)
			}
			var ranges [][2]uint64
			if !inlined || top.enclosing != noIndex {
				if ranges, err = dc.d.Ranges(e); err != nil {
					return fmt.Errorf("ranges of entry at %#x: %w", e.Offset, err)
				}
			}
			n, ok := dc.addNode(e, ranges, inlined, files)
			if !ok {
				// Declarations and abstract instances have no code; what they hold is
				// reached by reference from the instances that do.
				if e.Children {
					r.SkipChildren()
				}
				continue
			}
			if e.Children {
				stack = append(stack, level{enclosing: n, opened: n})
			} else {
				dc.t.nodes[n].end = n + 1
			}
		case dwarf.TagLexDwarfBlock, dwarf.TagNamespace, dwarf.TagModule, dwarf.TagTryDwarfBlock, dwarf.TagCatchDwarfBlock:
			// Functions and inlined calls nest inside these.
			if e.Children {
				stack = append(stack, level{enclosing: top.enclosing, opened: noIndex})
			}
		default:
			// Types, variables and parameters: member function declarations inside
			// classes are reached by reference when a definition names them.
			if e.Children {
				r.SkipChildren()
			}
		}
	}
	return nil
}

// addNode records a function or inlined call with code, returning false when it has none.
func (dc *decoder) addNode(e *dwarf.Entry, ranges [][2]uint64, inlined bool, files []uint32) (uint32, bool) {
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
		if f, ok := e.Val(dwarf.AttrCallFile).(int64); ok && f >= 0 && f < int64(len(files)) {
			nd.callFile = files[f]
		}
		if l, ok := e.Val(dwarf.AttrCallLine).(int64); ok {
			nd.callLine = clampU32(int(l))
		}
	} else {
		for _, rg := range t.ranges[off:] {
			t.funcs = append(t.funcs, span{pcRange: rg, node: n})
		}
	}
	t.nodes = append(t.nodes, nd)
	dc.pending = append(dc.pending, pendingName{node: n, die: e.Offset})
	if !inlined {
		return n, true
	}
	dc.dies[e.Offset] = nameOf(e)
	return n, true
}

// attrMIPSLinkageName is the pre-DWARF-4 spelling of DW_AT_linkage_name, which
// older GCC and some other compilers still emit.
const attrMIPSLinkageName dwarf.Attr = 0x2007

func nameOf(e *dwarf.Entry) dieName {
	var n dieName
	n.name, _ = e.Val(dwarf.AttrName).(string)
	if l, ok := e.Val(dwarf.AttrLinkageName).(string); ok {
		n.linkage = l
	} else if l, ok := e.Val(attrMIPSLinkageName).(string); ok {
		n.linkage = l
	}
	if ref, ok := e.Val(dwarf.AttrAbstractOrigin).(dwarf.Offset); ok {
		n.ref = ref
	} else if ref, ok := e.Val(dwarf.AttrSpecification).(dwarf.Offset); ok {
		n.ref = ref
	}
	return n
}

// die returns the naming attributes of the DIE at off, reading it if the walk skipped it.
func (dc *decoder) die(off dwarf.Offset) dieName {
	if n, ok := dc.dies[off]; ok {
		return n
	}
	var n dieName
	dc.seek.Seek(off)
	if e, err := dc.seek.Next(); err == nil && e != nil {
		n = nameOf(e)
	}
	dc.dies[off] = n
	return n
}

// name resolves the function name of the DIE at off: a linkage name anywhere along
// its abstract-origin and specification chain, else the first plain name, the way
// binutils names functions.
func (dc *decoder) name(off dwarf.Offset) uint32 {
	if i, ok := dc.resolved[off]; ok {
		return i
	}
	var plain, linkage string
	cur := off
	for range maxRefChain {
		n := dc.die(cur)
		if plain == "" {
			plain = n.name
		}
		if n.linkage != "" {
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
	case linkage != "":
		i = dc.intern(linkage) | linkageBit
	case plain != "":
		i = dc.intern(plain)
	}
	dc.resolved[off] = i
	return i
}

func (dc *decoder) intern(s string) uint32 {
	if i, ok := dc.nameIdx[s]; ok {
		return i
	}
	if len(dc.t.names) >= linkageBit-1 {
		return noIndex &^ linkageBit
	}
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

	// Sequences of different units interleave by address; where one ends at the
	// address the next starts at, the start wins.
	rank := func(r row) int {
		if r.file == endMarker {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(t.rows, func(a, b row) int {
		if c := cmp.Compare(a.addr, b.addr); c != 0 {
			return c
		}
		return cmp.Compare(rank(a), rank(b))
	})
	out := t.rows[:0]
	for _, r := range t.rows {
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
	// Exact-size copies: appending left up to twice the room, and the table lives
	// as long as the file stays cached.
	t.rows = slices.Clone(out)
	slices.SortStableFunc(t.funcs, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	t.funcs = slices.Clone(t.funcs)
	t.nodes = slices.Clone(t.nodes)
	t.ranges = slices.Clone(t.ranges)
	t.files = slices.Clone(t.files)
	t.names = slices.Clone(t.names)
}

// Lookup returns the frames at addr, innermost first, or nil when the debug
// information covers addr with neither a line nor a function.
func (t *Table) Lookup(addr uint64) []Frame {
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
		f.Name = t.str(t.names, n.name&^linkageBit)
		f.Linkage = n.name != noIndex && n.name&linkageBit != 0
		f.Entry = t.ranges[n.rangeOff].lo
		if i == 0 {
			f.File, f.Line = file, line
			continue
		}
		// The caller's position is where the frame inside it was inlined.
		inner := t.nodes[chain[len(chain)-i]]
		f.File, f.Line = t.str(t.files, inner.callFile), int64(inner.callLine)
	}
	return frames
}

func (t *Table) str(list []string, i uint32) string {
	if int(i) < len(list) {
		return list[i]
	}
	return ""
}

// line returns the line table's row for addr.
func (t *Table) line(addr uint64) (file string, line int64, ok bool) {
	i, found := slices.BinarySearchFunc(t.rows, addr, func(r row, a uint64) int { return cmp.Compare(r.addr, a) })
	if !found {
		i--
	}
	if i < 0 || t.rows[i].file == endMarker {
		return "", 0, false
	}
	r := t.rows[i]
	return t.str(t.files, r.file), int64(r.line), true
}

// chain returns the nodes covering addr, outermost first.
func (t *Table) chain(addr uint64, chain []uint32) []uint32 {
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

func (t *Table) covers(n uint32, addr uint64) bool {
	nd := t.nodes[n]
	for _, r := range t.ranges[nd.rangeOff:nd.rangeEnd] {
		if addr >= r.lo && addr < r.hi {
			return true
		}
	}
	return false
}

// Rows is the number of line table rows kept.
func (t *Table) Rows() int { return len(t.rows) }

// SizeBytes estimates the memory the table holds.
func (t *Table) SizeBytes() int64 {
	const strHeader = 16
	n := int64(cap(t.rows))*16 + int64(cap(t.nodes))*24 + int64(cap(t.ranges))*16 + int64(cap(t.funcs))*24
	for _, list := range [][]string{t.files, t.names} {
		n += int64(cap(list)) * strHeader
		for _, s := range list {
			n += int64(len(s))
		}
	}
	return n
}
