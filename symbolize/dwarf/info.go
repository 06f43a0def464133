package dwarf

import (
	"bytes"
	"debug/dwarf"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/sonde-profiler/sonde/internal/leb128"
	"math"
)

// This file reads .debug_info a unit or a DIE at a time. debug/dwarf parses every
// unit's header and abbreviation table when it opens the sections (12 MiB of heap
// and 36 ms for the C library) and keeps them while the sections are open; here a
// unit costs its header until a lookup decodes it, and a DIE is read where it lies.
// Values mean what debug/dwarf's Entry.Val would give, so that the table names what
// it named when it read everything through debug/dwarf.

// Attribute forms (DWARF 5 section 7.5.6, and the GNU extensions debug/dwarf knows).
const (
	formAddr          = 0x01
	formDwarfBlock2   = 0x03
	formDwarfBlock4   = 0x04
	formDwarfBlock1   = 0x0a
	formFlag          = 0x0c
	formSdata         = 0x0d
	formRefAddr       = 0x10
	formRef1          = 0x11
	formRef2          = 0x12
	formRef4          = 0x13
	formRef8          = 0x14
	formRefUdata      = 0x15
	formIndirect      = 0x16
	formSecOffset     = 0x17
	formExprloc       = 0x18
	formFlagPresent   = 0x19
	formRefSup4       = 0x1c
	formRefSig8       = 0x20
	formImplicitConst = 0x21
	formLoclistx      = 0x22
	formRnglistx      = 0x23
	formRefSup8       = 0x24
	formAddrx         = 0x1b
	formAddrx1        = 0x29
	formAddrx2        = 0x2a
	formAddrx3        = 0x2b
	formAddrx4        = 0x2c
	formGNURefAlt     = 0x1f20
	formGNUStrpAlt    = 0x1f21
)

// Unit types of DWARF 5 unit headers.
const (
	utSkeleton     = 0x04
	utSplitCompile = 0x05
	utType         = 0x02
	utSplitType    = 0x06
)

// Range list entry kinds of .debug_rnglists.
const (
	rleEndOfList    = 0x0
	rleBaseAddressx = 0x1
	rleStartxEndx   = 0x2
	rleStartxLength = 0x3
	rleOffsetPair   = 0x4
	rleBaseAddress  = 0x5
	rleStartEnd     = 0x6
	rleStartLength  = 0x7
)

// attrMIPSLinkageName is the pre-DWARF-4 spelling of DW_AT_linkage_name, which
// older GCC and some other compilers still emit.
const attrMIPSLinkageName dwarf.Attr = 0x2007

var errTruncated = errors.New("data ends inside an entry")

// secReader reads one section from an offset.
type secReader struct {
	b     []byte
	pos   int
	order binary.ByteOrder
	err   error
}

func (r *secReader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.pos = len(r.b)
}

func (r *secReader) take(n int) []byte {
	if n < 0 || n > len(r.b)-r.pos {
		r.fail(errTruncated)
		return nil
	}
	v := r.b[r.pos : r.pos+n]
	r.pos += n
	return v
}

func (r *secReader) skip(n uint64) {
	if n > uint64(len(r.b)-r.pos) {
		r.fail(errTruncated)
		return
	}
	r.pos += int(n)
}

func (r *secReader) u8() uint8 {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *secReader) u16() uint16 {
	if b := r.take(2); b != nil {
		return r.order.Uint16(b)
	}
	return 0
}

func (r *secReader) u24() uint32 {
	b := r.take(3)
	if b == nil {
		return 0
	}
	if r.order == binary.BigEndian {
		return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2])
	}
	return uint32(b[2])<<16 | uint32(b[1])<<8 | uint32(b[0])
}

func (r *secReader) u32() uint32 {
	if b := r.take(4); b != nil {
		return r.order.Uint32(b)
	}
	return 0
}

func (r *secReader) u64() uint64 {
	if b := r.take(8); b != nil {
		return r.order.Uint64(b)
	}
	return 0
}

// uint reads an address or offset of n bytes.
func (r *secReader) uint(n int) uint64 {
	switch n {
	case 1:
		return uint64(r.u8())
	case 2:
		return uint64(r.u16())
	case 4:
		return uint64(r.u32())
	case 8:
		return r.u64()
	}
	r.fail(fmt.Errorf("unsupported size %d", n))
	return 0
}

func (r *secReader) uleb() uint64 {
	v, n := leb128.Uint(r.b[min(r.pos, len(r.b)):])
	if n == 0 {
		r.pos = len(r.b)
		r.fail(errTruncated)
		return 0
	}
	r.pos += n
	return v
}

func (r *secReader) sleb() int64 {
	v, n := leb128.Int(r.b[min(r.pos, len(r.b)):])
	if n == 0 {
		r.pos = len(r.b)
		r.fail(errTruncated)
		return 0
	}
	r.pos += n
	return v
}

// cstring reads a NUL-terminated string, in place.
func (r *secReader) cstring() []byte {
	i := bytes.IndexByte(r.b[r.pos:], 0)
	if i < 0 {
		r.fail(errors.New("unterminated string"))
		return nil
	}
	s := r.b[r.pos : r.pos+i]
	r.pos += i + 1
	return s
}

// unitLength reads an initial length: the length and whether the 64-bit format is in use.
func (r *secReader) unitLength() (uint64, bool) {
	n := r.u32()
	switch {
	case n == 0xffffffff:
		return r.u64(), true
	case n >= 0xfffffff0:
		r.fail(errors.New("unit length has a reserved value"))
		return 0, false
	}
	return uint64(n), false
}

// sectionIndex names the sections a lookup reads.
type sectionIndex int

const (
	secInfo sectionIndex = iota
	secAbbrev
	secStr
	secLine
	secRanges
	secAddr
	secLineStr
	secStrOffsets
	secRnglists
	secAranges
	numSections
)

var sectionNames = [numSections]string{"info", "abbrev", "str", "line", "ranges", "addr", "line_str", "str_offsets", "rnglists", "aranges"}

// sections are one file's DWARF sections, as bytes, for one decoding. Parts of the
// compressed .debug_info, .debug_abbrev and .debug_line are decompressed only once
// need says so (lazy.go): elsewhere they read as zeros.
type sections struct {
	data  [numSections][]byte
	order binary.ByteOrder
	t     *Table // nil: every section is whole
}

// need makes [off, end) of section sec readable.
func (s *sections) need(sec sectionIndex, off, end uint64) error {
	if s.t == nil {
		return nil
	}
	return s.t.need(sec, off, end)
}

// needUnit makes unit u's entries and abbreviations readable.
func (s *sections) needUnit(u *unit) error {
	if err := s.need(secInfo, u.off, u.end); err != nil {
		return err
	}
	return s.need(secAbbrev, u.abbrev, u.abbrevEnd)
}

// needLine makes the line program at off readable and returns its end.
func (s *sections) needLine(off uint64) (uint64, error) {
	if err := s.need(secLine, off, off+12); err != nil {
		return 0, err
	}
	line := s.data[secLine]
	if off >= uint64(len(line)) {
		return 0, fmt.Errorf("line program at %#x past the end of .debug_line", off)
	}
	r := &secReader{b: line, pos: int(off), order: lineByteOrder(line[off:])}
	n, _ := r.unitLength()
	if r.err != nil || n > uint64(len(line)-r.pos) {
		return 0, fmt.Errorf("line program at %#x: length %#x exceeds the section", off, n)
	}
	end := uint64(r.pos) + n
	return end, s.need(secLine, off, end)
}

// unit is what the index keeps of a unit: where it is and how its header reads.
type unit struct {
	off    uint64 // of the header in .debug_info
	end    uint64 // one past the unit's last byte
	abbrev uint64 // of its abbreviation table in .debug_abbrev
	// line and lineEnd bound its line program in .debug_line; lineEnd is 0 when it
	// has none. abbrevEnd is where its abbreviation table ends.
	line, lineEnd, abbrevEnd uint64
	dieOff                   uint8 // the first DIE's offset from off
	vers                     uint8
	asize                    uint8
	is64                     bool
}

// walkUnits reads the unit headers of .debug_info, rejecting what debug/dwarf would,
// and hands each unit to each as it is read, with the units so far: one walk through
// the section does the index's work.
func walkUnits(s *sections, each func(units []unit) error) ([]unit, error) {
	r := &secReader{b: s.data[secInfo], order: s.order}
	var units []unit
	for r.pos < len(r.b) && r.err == nil {
		start := r.pos
		// The longest header: a 64-bit length, a type unit's signature and offset.
		if err := s.need(secInfo, uint64(start), uint64(start)+64); err != nil {
			return nil, err
		}
		if s.t != nil {
			s.t.slide(secInfo, uint64(start))
		}
		n, is64 := r.unitLength()
		if r.err != nil {
			break
		}
		if n == 0 {
			continue // an empty unit, which debug/dwarf steps over too
		}
		if n != uint64(uint32(n)) || n > uint64(len(r.b)-r.pos) {
			return nil, fmt.Errorf("unit at %#x: length %#x past the end of .debug_info", start, n)
		}
		end := r.pos + int(n)
		vers := r.u16()
		if vers < 2 || vers > 5 {
			return nil, fmt.Errorf("unit at %#x: unsupported DWARF version %d", start, vers)
		}
		u := unit{off: uint64(start), end: uint64(end), vers: uint8(vers), is64: is64}
		var utype uint8
		if vers >= 5 {
			utype = r.u8()
			u.asize = r.u8()
		}
		if is64 {
			u.abbrev = r.u64()
		} else {
			u.abbrev = uint64(r.u32())
		}
		if vers < 5 {
			u.asize = r.u8()
		}
		switch utype {
		case utSkeleton, utSplitCompile:
			r.u64()
		case utType, utSplitType:
			r.u64()
			if is64 {
				r.u64()
			} else {
				r.u32()
			}
		}
		if r.err != nil || r.pos > end {
			return nil, fmt.Errorf("unit at %#x: header runs past the unit", start)
		}
		if u.asize != 1 && u.asize != 2 && u.asize != 4 && u.asize != 8 {
			return nil, fmt.Errorf("unit at %#x: address size %d", start, u.asize)
		}
		u.dieOff = uint8(r.pos - start)
		units = append(units, u)
		r.pos = end
		if err := each(units); err != nil {
			return nil, err
		}
	}
	if r.err != nil {
		return nil, fmt.Errorf("read .debug_info unit headers: %w", r.err)
	}
	return units, nil
}

// attrSpec is one attribute of an abbreviation.
type attrSpec struct {
	attr     dwarf.Attr
	form     uint32
	implicit int64 // the value of DW_FORM_implicit_const
}

// abbrev is one abbreviation declaration.
type abbrev struct {
	tag      dwarf.Tag
	children bool
	attrs    []attrSpec
}

// abbrevTable is a unit's abbreviations by code: most producers number them from 1
// without gaps, which a slice serves; others go to the map.
type abbrevTable struct {
	dense  []abbrev
	sparse map[uint64]abbrev
}

func (t *abbrevTable) get(code uint64) (*abbrev, bool) {
	if code < uint64(len(t.dense)) && t.dense[code].tag != 0 {
		return &t.dense[code], true
	}
	a, ok := t.sparse[code]
	return &a, ok
}

// maxAbbrevCode bounds the codes kept in the dense slice.
const maxAbbrevCode = 1 << 16

// parseAbbrevs reads the abbreviation table at off.
func parseAbbrevs(s *sections, off uint64) (*abbrevTable, error) {
	b := s.data[secAbbrev]
	if off >= uint64(len(b)) {
		return nil, fmt.Errorf("abbreviation table at %#x past the end of .debug_abbrev", off)
	}
	r := &secReader{b: b, pos: int(off), order: s.order}
	type decl struct {
		code       uint64
		a          abbrev
		start, end int
	}
	var (
		specs []attrSpec // one backing array for all declarations
		decls []decl
	)
	for {
		code, a, err := readAbbrev(r, &specs)
		if err != nil {
			return nil, fmt.Errorf("abbreviation table at %#x: %w", off, err)
		}
		if code == 0 {
			break
		}
		decls = append(decls, decl{code: code, a: a, start: len(specs) - len(a.attrs), end: len(specs)})
	}
	// Codes numbered densely go to the slice; a table whose codes are scattered must
	// not make it large.
	maxCode := uint64(0)
	for _, d := range decls {
		if d.code < maxAbbrevCode {
			maxCode = max(maxCode, d.code)
		}
	}
	if maxCode > 2*uint64(len(decls))+16 {
		maxCode = 0
	}
	t := &abbrevTable{dense: make([]abbrev, maxCode+1)}
	for _, d := range decls {
		d.a.attrs = specs[d.start:d.end:d.end]
		// A code declared twice means its last declaration, as in debug/dwarf.
		if d.code < uint64(len(t.dense)) {
			t.dense[d.code] = d.a
			continue
		}
		if t.sparse == nil {
			t.sparse = map[uint64]abbrev{}
		}
		t.sparse[d.code] = d.a
	}
	return t, nil
}

// readAbbrev reads one declaration, appending its attributes to *specs; code 0
// ends the table. The declaration's attrs are valid until *specs grows again.
func readAbbrev(r *secReader, specs *[]attrSpec) (uint64, abbrev, error) {
	code := uint64(uint32(r.uleb())) // debug/dwarf keeps 32 bits of a code
	if r.err != nil || code == 0 {
		return 0, abbrev{}, r.err
	}
	a := abbrev{tag: dwarf.Tag(r.uleb()), children: r.u8() != 0}
	if a.tag == 0 {
		a.tag = tagNone // a declaration of tag 0 is still a declaration
	}
	start := len(*specs)
	for {
		attr, form := r.uleb(), r.uleb()
		if r.err != nil {
			return 0, abbrev{}, r.err
		}
		if attr == 0 && form == 0 {
			break
		}
		sp := attrSpec{attr: dwarf.Attr(attr), form: uint32(min(form, math.MaxUint32))}
		if form == formImplicitConst {
			sp.implicit = r.sleb()
		}
		if !knownForm(sp.form) {
			return 0, abbrev{}, fmt.Errorf("abbreviation %d: unknown attribute form %#x", code, form)
		}
		*specs = append(*specs, sp)
	}
	a.attrs = (*specs)[start:]
	return code, a, nil
}

// tagNone stands for tag 0 in a declaration, which the dense table uses for "no
// declaration"; no real tag has this value.
const tagNone dwarf.Tag = math.MaxUint32

func knownForm(form uint32) bool {
	switch form {
	case formAddr, formAddrx, formAddrx1, formAddrx2, formAddrx3, formAddrx4,
		formDwarfBlock1, formDwarfBlock2, formDwarfBlock4, formBlock,
		formData1, formData2, formData4, formData8, formData16, formSdata, formUdata, formImplicitConst,
		formFlag, formFlagPresent,
		formRefAddr, formRef1, formRef2, formRef4, formRef8, formRefUdata, formRefSup4, formRefSup8, formRefSig8,
		formString, formStrp, formStrx, formStrpSup, formLineStrp, formStrx1, formStrx2, formStrx3, formStrx4,
		formSecOffset, formExprloc, formGNURefAlt, formGNUStrpAlt, formLoclistx, formRnglistx, formIndirect:
		return true
	}
	return false
}

// unitCtx is a unit being read: its header, abbreviations and the bases its
// compile unit DIE sets for indexed forms.
type unitCtx struct {
	s       *sections
	u       *unit
	abbrevs *abbrevTable
	// DWARF 5 bases, from the unit DIE; zero in earlier versions, as debug/dwarf has them.
	addrBase, strOffsetsBase, rnglistsBase uint64
}

// value is an attribute's value, classed the way debug/dwarf's Entry.Val types it.
type value struct {
	kind valueKind
	u    uint64 // address, reference offset, or constant bits
	s    []byte // string, in place in its section
}

type valueKind uint8

const (
	valNone    valueKind = iota // absent, or of a type no attribute read here is taken from
	valAddress                  // uint64: addr, addrx
	valInt                      // int64: data1-8, sdata, udata, implicit_const, sec_offset, GNU alt forms
	valOffset                   // dwarf.Offset: references within the file
	valString                   // string
	valRnglist                  // uint64: a resolved DW_FORM_rnglistx
)

// entry is a DIE, reduced to the attributes naming and ranges read.
type entry struct {
	off      uint64
	tag      dwarf.Tag
	children bool
	// The attributes read, by what they are; kind valNone when absent.
	name, linkage, mipsLinkage, compDir    value
	abstractOrigin, specification          value
	lowPC, highPC, entryPC, ranges         value
	callFile, callLine, stmtList, sibling  value
	addrBase, strOffsetsBase, rnglistsBase value
	highPCConst                            bool // highPC is a constant (an offset from lowPC)
	rangesClass                            rangesClass
}

// rangesClass is debug/dwarf's class of a DW_AT_ranges value.
type rangesClass uint8

const (
	rangesOther   rangesClass = iota
	rangesListPtr             // ClassRangeListPtr: a section offset
	rangesRngList             // ClassRngList: DW_FORM_rnglistx
)

// readEntry reads the DIE at off (an offset into .debug_info inside the unit). A
// null entry has tag 0. It returns the offset after the entry.
func (c *unitCtx) readEntry(off uint64, e *entry) (uint64, error) {
	info := c.s.data[secInfo]
	if off < c.u.off+uint64(c.u.dieOff) || off >= c.u.end {
		return 0, fmt.Errorf("entry at %#x outside its unit", off)
	}
	r := &secReader{b: info[:c.u.end], pos: int(off), order: c.s.order}
	*e = entry{off: off}
	code := uint64(uint32(r.uleb()))
	if r.err != nil {
		return 0, fmt.Errorf("entry at %#x: %w", off, r.err)
	}
	if code == 0 {
		return uint64(r.pos), nil
	}
	a, ok := c.abbrevs.get(code)
	if !ok {
		return 0, fmt.Errorf("entry at %#x: unknown abbreviation %d", off, code)
	}
	e.tag, e.children = a.tag, a.children
	if e.tag == tagNone {
		e.tag = 0xffff // a declared tag 0 is no tag this package reads, unlike a null entry
	}
	for i := range a.attrs {
		sp := &a.attrs[i]
		form := sp.form
		if form == formIndirect {
			form = uint32(min(r.uleb(), math.MaxUint32))
			if !knownForm(form) || form == formIndirect {
				return 0, fmt.Errorf("entry at %#x: unknown indirect form %#x", off, form)
			}
		}
		v, class := c.readValue(r, sp.attr, form, sp.implicit)
		if r.err != nil {
			return 0, fmt.Errorf("entry at %#x: %w", off, r.err)
		}
		switch sp.attr {
		case dwarf.AttrName:
			e.name = v
		case dwarf.AttrLinkageName:
			e.linkage = v
		case attrMIPSLinkageName:
			e.mipsLinkage = v
		case dwarf.AttrCompDir:
			e.compDir = v
		case dwarf.AttrAbstractOrigin:
			e.abstractOrigin = v
		case dwarf.AttrSpecification:
			e.specification = v
		case dwarf.AttrLowpc:
			e.lowPC = v
		case dwarf.AttrHighpc:
			e.highPC = v
			e.highPCConst = class == classConstant
		case dwarf.AttrEntrypc:
			e.entryPC = v
		case dwarf.AttrRanges:
			e.ranges = v
			switch {
			case class == classRangeListPtr:
				e.rangesClass = rangesListPtr
			case v.kind == valRnglist:
				e.rangesClass = rangesRngList
			}
		case dwarf.AttrCallFile:
			e.callFile = v
		case dwarf.AttrCallLine:
			e.callLine = v
		case dwarf.AttrStmtList:
			e.stmtList = v
		case dwarf.AttrSibling:
			e.sibling = v
		case dwarf.AttrAddrBase:
			e.addrBase = v
		case dwarf.AttrStrOffsetsBase:
			e.strOffsetsBase = v
		case dwarf.AttrRnglistsBase:
			e.rnglistsBase = v
		}
	}
	return uint64(r.pos), nil
}

type class uint8

const (
	classOther class = iota
	classConstant
	classRangeListPtr
)

// readValue reads one attribute value of form, and debug/dwarf's class of it where
// the attribute's meaning depends on it (DW_AT_high_pc, DW_AT_ranges).
func (c *unitCtx) readValue(r *secReader, attr dwarf.Attr, form uint32, implicit int64) (value, class) {
	offSize := 4
	if c.u.is64 {
		offSize = 8
	}
	constant := func(v uint64) (value, class) {
		return value{kind: valInt, u: v}, classConstant
	}
	switch form {
	case formAddr:
		return value{kind: valAddress, u: r.uint(int(c.u.asize))}, classOther
	case formAddrx, formAddrx1, formAddrx2, formAddrx3, formAddrx4:
		var idx uint64
		switch form {
		case formAddrx:
			idx = r.uleb()
		case formAddrx1:
			idx = uint64(r.u8())
		case formAddrx2:
			idx = uint64(r.u16())
		case formAddrx3:
			idx = uint64(r.u24())
		case formAddrx4:
			idx = uint64(r.u32())
		}
		if r.err != nil {
			return value{}, classOther
		}
		a, err := c.debugAddr(c.addrBase, idx)
		if err != nil {
			r.fail(err)
			return value{}, classOther
		}
		return value{kind: valAddress, u: a}, classOther
	case formDwarfBlock1:
		r.skip(uint64(r.u8()))
	case formDwarfBlock2:
		r.skip(uint64(r.u16()))
	case formDwarfBlock4:
		r.skip(uint64(r.u32()))
	case formBlock, formExprloc:
		r.skip(r.uleb())
	case formData1:
		return constant(uint64(r.u8()))
	case formData2:
		return constant(uint64(r.u16()))
	case formData4:
		return constant(uint64(r.u32()))
	case formData8:
		return constant(r.u64())
	case formData16:
		r.skip(16)
		return value{}, classConstant // a []byte to debug/dwarf: no int64
	case formSdata:
		return constant(uint64(r.sleb()))
	case formUdata:
		return constant(r.uleb())
	case formImplicitConst:
		return constant(uint64(implicit))
	case formFlag:
		r.u8()
	case formFlagPresent:
	case formRefAddr:
		if c.u.vers == 2 {
			return value{kind: valOffset, u: r.uint(int(c.u.asize))}, classOther
		}
		return value{kind: valOffset, u: r.uint(offSize)}, classOther
	case formRef1:
		return value{kind: valOffset, u: uint64(r.u8()) + c.u.off}, classOther
	case formRef2:
		return value{kind: valOffset, u: uint64(r.u16()) + c.u.off}, classOther
	case formRef4:
		return value{kind: valOffset, u: uint64(r.u32()) + c.u.off}, classOther
	case formRef8:
		return value{kind: valOffset, u: r.u64() + c.u.off}, classOther
	case formRefUdata:
		return value{kind: valOffset, u: r.uleb() + c.u.off}, classOther
	case formString:
		return value{kind: valString, s: r.cstring()}, classOther
	case formStrp, formLineStrp:
		off := r.uint(offSize)
		if r.err != nil {
			return value{}, classOther
		}
		sec := secStr
		if form == formLineStrp {
			sec = secLineStr
			if len(c.s.data[secLineStr]) == 0 {
				r.fail(errors.New("DW_FORM_line_strp with no .debug_line_str section"))
				return value{}, classOther
			}
		}
		s, err := cstringAt(c.s.data[sec], off)
		if err != nil {
			r.fail(fmt.Errorf("string at %#x of .debug_%s: %w", off, sectionNames[sec], err))
			return value{}, classOther
		}
		return value{kind: valString, s: s}, classOther
	case formStrx, formStrx1, formStrx2, formStrx3, formStrx4:
		var idx uint64
		switch form {
		case formStrx:
			idx = r.uleb()
		case formStrx1:
			idx = uint64(r.u8())
		case formStrx2:
			idx = uint64(r.u16())
		case formStrx3:
			idx = uint64(r.u24())
		case formStrx4:
			idx = uint64(r.u32())
		}
		if r.err != nil {
			return value{}, classOther
		}
		s, err := c.strx(idx)
		if err != nil {
			r.fail(err)
			return value{}, classOther
		}
		return value{kind: valString, s: s}, classOther
	case formStrpSup:
		r.uint(offSize) // an integer to debug/dwarf: no string
	case formSecOffset, formGNURefAlt, formGNUStrpAlt:
		v := value{kind: valInt, u: r.uint(offSize)}
		if form == formSecOffset && attr == dwarf.AttrRanges {
			return v, classRangeListPtr
		}
		return v, classOther
	case formRefSig8:
		r.u64()
	case formRefSup4:
		r.u32()
	case formRefSup8:
		r.u64()
	case formLoclistx:
		r.uleb()
	case formRnglistx:
		idx := r.uleb()
		if r.err != nil {
			return value{}, classOther
		}
		off, err := c.rnglistx(idx)
		if err != nil {
			r.fail(err)
			return value{}, classOther
		}
		return value{kind: valRnglist, u: off}, classOther
	default:
		r.fail(fmt.Errorf("unknown attribute form %#x", form))
	}
	return value{}, classOther
}

func cstringAt(b []byte, off uint64) ([]byte, error) {
	if off >= uint64(len(b)) {
		return nil, errors.New("offset out of range")
	}
	i := bytes.IndexByte(b[off:], 0)
	if i < 0 {
		return nil, errors.New("unterminated string")
	}
	return b[off : off+uint64(i)], nil
}

func (c *unitCtx) offsetSize() uint64 {
	if c.u.is64 {
		return 8
	}
	return 4
}

// strx resolves a DW_FORM_strx index through .debug_str_offsets.
func (c *unitCtx) strx(idx uint64) ([]byte, error) {
	offs := c.s.data[secStrOffsets]
	if len(offs) == 0 {
		return nil, errors.New("DW_FORM_strx with no .debug_str_offsets section")
	}
	size := c.offsetSize()
	if idx > math.MaxUint64/size {
		return nil, errors.New("DW_FORM_strx offset out of range")
	}
	at := c.strOffsetsBase + idx*size
	if at < c.strOffsetsBase || at > uint64(len(offs)) || uint64(len(offs))-at < size {
		return nil, errors.New("DW_FORM_strx offset out of range")
	}
	r := &secReader{b: offs, pos: int(at), order: c.s.order}
	off := r.uint(int(size))
	s, err := cstringAt(c.s.data[secStr], off)
	if err != nil {
		return nil, fmt.Errorf("DW_FORM_strx string at %#x: %w", off, err)
	}
	return s, nil
}

// rnglistx resolves a DW_FORM_rnglistx index to an offset in .debug_rnglists.
func (c *unitCtx) rnglistx(idx uint64) (uint64, error) {
	lists := c.s.data[secRnglists]
	size := c.offsetSize()
	if idx > math.MaxUint64/size {
		return 0, errors.New("DW_FORM_rnglistx offset out of range")
	}
	at := c.rnglistsBase + idx*size
	if at < c.rnglistsBase || at > uint64(len(lists)) || uint64(len(lists))-at < size {
		return 0, errors.New("DW_FORM_rnglistx offset out of range")
	}
	r := &secReader{b: lists, pos: int(at), order: c.s.order}
	return c.rnglistsBase + r.uint(int(size)), nil
}

// debugAddr reads entry idx of the unit's .debug_addr table at base.
func (c *unitCtx) debugAddr(base, idx uint64) (uint64, error) {
	addrs := c.s.data[secAddr]
	if addrs == nil {
		return 0, errors.New("DW_FORM_addrx with no .debug_addr section")
	}
	size := uint64(c.u.asize)
	if idx > (math.MaxUint64-base)/size {
		return 0, errors.New("address index out of range")
	}
	at := base + idx*size
	if at > uint64(len(addrs)) || uint64(len(addrs))-at < size {
		return 0, fmt.Errorf("address index %d out of range", idx)
	}
	r := &secReader{b: addrs, pos: int(at), order: c.s.order}
	return r.uint(int(size)), nil
}

// openUnit reads the unit DIE of u and sets the bases it gives.
func openUnit(s *sections, u *unit, abbrevs *abbrevTable) (*unitCtx, *entry, error) {
	c := &unitCtx{s: s, u: u, abbrevs: abbrevs}
	var e entry
	if _, err := c.readEntry(u.off+uint64(u.dieOff), &e); err != nil {
		return nil, nil, err
	}
	if u.vers >= 5 {
		// Read with the bases zero first, as debug/dwarf collects them; then again
		// with them, for the unit's own indexed attributes.
		c.addrBase, c.strOffsetsBase, c.rnglistsBase = e.addrBase.int(), e.strOffsetsBase.int(), e.rnglistsBase.int()
		if _, err := c.readEntry(u.off+uint64(u.dieOff), &e); err != nil {
			return nil, nil, err
		}
	}
	return c, &e, nil
}

// int is an int64-typed value as a uint64, 0 for any other.
func (v value) int() uint64 {
	if v.kind == valInt {
		return v.u
	}
	return 0
}

// str is a string-typed value, "" for any other.
func (v value) str() []byte {
	if v.kind == valString {
		return v.s
	}
	return nil
}

// ranges returns the address ranges of e, as debug/dwarf's Data.Ranges does. cu is
// the unit's DIE, which sets the base address.
func (c *unitCtx) ranges(e, cu *entry, ret [][2]uint64) ([][2]uint64, error) {
	if e.lowPC.kind == valAddress {
		switch {
		case e.highPC.kind == valAddress:
			ret = append(ret, [2]uint64{e.lowPC.u, e.highPC.u})
		case e.highPC.kind == valInt && e.highPCConst:
			ret = append(ret, [2]uint64{e.lowPC.u, e.lowPC.u + e.highPC.u})
		}
	}
	base := uint64(0)
	switch {
	case cu.entryPC.kind == valAddress:
		base = cu.entryPC.u
	case cu.lowPC.kind == valAddress:
		base = cu.lowPC.u
	}
	if c.u.vers >= 5 && c.s.data[secRnglists] != nil {
		switch e.rangesClass {
		case rangesListPtr:
			if e.ranges.kind != valInt {
				return ret, nil
			}
			return c.rnglists(base, cu.addrBase.int(), e.ranges.u, ret)
		case rangesRngList:
			return c.rnglists(base, cu.addrBase.int(), e.ranges.u, ret)
		}
		return ret, nil
	}
	if e.ranges.kind == valInt && c.s.data[secRanges] != nil {
		return c.debugRanges(base, e.ranges.u, ret)
	}
	return ret, nil
}

// debugRanges reads a DWARF 2-4 range list in .debug_ranges.
func (c *unitCtx) debugRanges(base, off uint64, ret [][2]uint64) ([][2]uint64, error) {
	b := c.s.data[secRanges]
	if int64(off) < 0 || off > uint64(len(b)) {
		return nil, fmt.Errorf("invalid range offset %d (max %d)", int64(off), len(b))
	}
	r := &secReader{b: b, pos: int(off), order: c.s.order}
	size := int(c.u.asize)
	maxAddr := ^uint64(0) >> uint((8-size)*8)
	for r.pos < len(r.b) {
		lo, hi := r.uint(size), r.uint(size)
		if r.err != nil || (lo == 0 && hi == 0) {
			break // debug/dwarf ends a list that runs off the section quietly too
		}
		if lo == maxAddr {
			base = hi
			continue
		}
		ret = append(ret, [2]uint64{base + lo, base + hi})
	}
	return ret, nil
}

// rnglists reads a DWARF 5 range list in .debug_rnglists.
func (c *unitCtx) rnglists(base, addrBase, off uint64, ret [][2]uint64) ([][2]uint64, error) {
	b := c.s.data[secRnglists]
	if int64(off) < 0 || off > uint64(len(b)) {
		return nil, fmt.Errorf("invalid rnglist offset %d (max %d)", int64(off), len(b))
	}
	r := &secReader{b: b, pos: int(off), order: c.s.order}
	size := int(c.u.asize)
	addr := func(idx uint64) uint64 {
		a, err := c.debugAddr(addrBase, idx)
		if err != nil {
			r.fail(err)
		}
		return a
	}
	for {
		// Each entry takes a byte at least, so the list ends with the section.
		switch r.u8() {
		case rleEndOfList:
			if r.err != nil {
				return nil, r.err
			}
			return ret, nil
		case rleBaseAddressx:
			base = addr(r.uleb())
		case rleStartxEndx:
			lo := addr(r.uleb())
			hi := addr(r.uleb())
			ret = append(ret, [2]uint64{lo, hi})
		case rleStartxLength:
			lo := addr(r.uleb())
			ret = append(ret, [2]uint64{lo, lo + r.uleb()})
		case rleOffsetPair:
			lo, hi := r.uleb(), r.uleb()
			ret = append(ret, [2]uint64{base + lo, base + hi})
		case rleBaseAddress:
			base = r.uint(size)
		case rleStartEnd:
			lo, hi := r.uint(size), r.uint(size)
			ret = append(ret, [2]uint64{lo, hi})
		case rleStartLength:
			lo := r.uint(size)
			ret = append(ret, [2]uint64{lo, lo + r.uleb()})
		}
		if r.err != nil {
			return nil, r.err
		}
	}
}
