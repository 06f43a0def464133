package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/sonde-profiler/sonde/internal/leb128"
	"sort"
	"unicode/utf16"
)

// Bounds of what is read from a process: everything there can lie.
const (
	maxString      = 4096     // characters of a name or file
	maxSource      = 16 << 20 // characters of a script's source, when its line ends are computed here
	maxLineEnds    = 1 << 20  // lines of a script
	maxPositions   = 1 << 20  // bytes of a source position table
	maxInlined     = 64       // functions inlined into each other at one pc
	maxCodeScan    = 1 << 20  // bytes searched back from a pc for its instructions' start
	scanChunk      = 16 << 10 // bytes read at once in that search
	codeAlignment  = 32       // instructions start on 32-byte boundaries (64 on newer V8s, a multiple)
	maxScopeLocals = 1 << 12
	// inlineLocalNames: a ScopeInfo lists up to this many context locals' names inline,
	// more in a hash table of one slot (kScopeInfoMaxInlinedLocalNamesSize).
	inlineLocalNames = 75
	noPosition       = -1
)

var (
	errType   = errors.New("not the object expected")
	errBounds = errors.New("past a bound")
)

// heap reads V8's objects in one process. Not safe for concurrent use.
type heap struct {
	m     Memory
	md    *Metadata
	isMap uint64 // the InstructionStream map, once found
	// bcPositions is a BytecodeArray's source position slot where the metadata does not
	// name it, once found.
	bcPositions int64
}

func untag(v uint64) (uint64, bool) {
	if v&3 != 1 || v>>47 != 0 || v < 4096 {
		return 0, false
	}
	return v - 1, true
}

func (h *heap) smi(v uint64) (int64, bool) {
	if v&1 != 0 {
		return 0, false
	}
	return int64(v) >> h.md.SmiShift, true
}

func (h *heap) word(addr uint64) (uint64, error) { return readU64(h.m, addr) }

// field reads a tagged field of an untagged object and untags it.
func (h *heap) field(obj uint64, off int64) (uint64, error) {
	v, err := h.word(obj + uint64(off))
	if err != nil {
		return 0, err
	}
	p, ok := untag(v)
	if !ok {
		return 0, errType
	}
	return p, nil
}

func (h *heap) typeOf(obj uint64) (int64, error) {
	m, err := h.field(obj, 0)
	if err != nil {
		return 0, err
	}
	var b [2]byte
	if err := h.m.ReadAt(b[:], m+uint64(h.md.MapInstanceType)); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint16(b[:])), nil
}

func (h *heap) isType(obj uint64, t int64) bool {
	got, err := h.typeOf(obj)
	return err == nil && got == t
}

// isFixedArray and isByteArray take V8 12's trusted arrays for what they were before.
func (h *heap) isFixedArray(obj uint64) bool {
	t, err := h.typeOf(obj)
	return err == nil && (t == h.md.TypeFixedArray || t == h.md.TypeTrustedFixedArray || t == h.md.TypeProtectedFixedArray)
}

func (h *heap) isByteArray(obj uint64) bool {
	t, err := h.typeOf(obj)
	return err == nil && (t == h.md.TypeByteArray || t == h.md.TypeTrustedByteArray)
}

// slotOfType reads obj's tagged slots from 8 up to end and returns the one object among
// them that is of a type ok takes; errType if none or several are. It finds fields the
// metadata does not name (V8 12's) by what they hold.
func (h *heap) slotOfType(obj uint64, end int64, ok func(t int64) bool) (uint64, error) {
	if end <= 8 || end > 128 {
		return 0, errType
	}
	found := uint64(0)
	for off := int64(8); off < end; off += 8 {
		p, err := h.field(obj, off)
		if err != nil {
			continue
		}
		if t, err := h.typeOf(p); err == nil && ok(t) {
			if found != 0 {
				return 0, errType
			}
			found = p
		}
	}
	if found == 0 {
		return 0, errType
	}
	return found, nil
}

// functionData returns a SharedFunctionInfo's function data: its bytecode, its baseline
// code or its interpreter data.
func (h *heap) functionData(sfi uint64) (uint64, error) {
	md := h.md
	if md.SFIFunction != 0 {
		return h.field(sfi, md.SFIFunction)
	}
	return h.slotOfType(sfi, md.SFINameOrScopeInfo, func(t int64) bool {
		return t == md.TypeBytecodeArray || t == md.TypeCode || t == md.TypeInterpreterData
	})
}

// codeDeopt returns a Code's deoptimization data (optimized code) or its bytecode
// (baseline code).
func (h *heap) codeDeopt(code uint64) (uint64, error) {
	md := h.md
	if md.CodeDeoptData != 0 {
		return h.field(code, md.CodeDeoptData)
	}
	return h.slotOfType(code, md.CodeNamedFrom, func(t int64) bool {
		return t == md.TypeFixedArray || t == md.TypeTrustedFixedArray || t == md.TypeProtectedFixedArray ||
			t == md.TypeBytecodeArray || t == md.TypeInterpreterData
	})
}

// codePositions returns a Code's source position table.
func (h *heap) codePositions(code uint64) (uint64, error) {
	md := h.md
	if md.CodePositions != 0 {
		return h.field(code, md.CodePositions)
	}
	return h.slotOfType(code, md.CodeNamedFrom, func(t int64) bool { return t == md.TypeByteArray || t == md.TypeTrustedByteArray })
}

// bytecodePositions returns a BytecodeArray's source position table. V8 12 does not name
// it, and keeps a handler table of the same type beside it, of 16-byte entries (four
// int32s a try block). The slot is learnt from a BytecodeArray where one slot only holds
// a table that is not a whole number of such entries and reads as source positions within
// the bytecode; it is then the slot of every BytecodeArray of the process.
func (h *heap) bytecodePositions(bc uint64) (uint64, error) {
	md := h.md
	if md.BytecodePositions != 0 {
		return h.field(bc, md.BytecodePositions)
	}
	if h.bcPositions != 0 {
		return h.field(bc, h.bcPositions)
	}
	size, err := h.length(bc)
	if err != nil {
		return 0, err
	}
	var slot int64
	for off := md.BytecodeNamedTo; off < md.BytecodeHeader && off < 128; off += 8 {
		p, err := h.field(bc, off)
		if err != nil || !h.isByteArray(p) {
			continue
		}
		if n, err := h.length(p); err != nil || n == 0 || n%16 == 0 {
			continue
		}
		if positions, err := h.positionsOf(p); err != nil || !plausiblePositions(positions, size) {
			continue
		}
		if slot != 0 {
			return 0, errType // two candidates: this one cannot tell
		}
		slot = off
	}
	if slot == 0 {
		return 0, errType
	}
	h.bcPositions = slot
	return h.field(bc, slot)
}

func (h *heap) length(obj uint64) (int, error) {
	v, err := h.word(obj + uint64(h.md.FixedArrayLength))
	if err != nil {
		return 0, err
	}
	n, ok := h.smi(v)
	if !ok || n < 0 {
		return 0, errType
	}
	return int(n), nil
}

// str reads a String object, at most max characters of it.
func (h *heap) str(obj uint64, max int) (string, error) {
	var b [4]byte
	if err := h.m.ReadAt(b[:], obj+uint64(h.md.StringLength)); err != nil {
		return "", err
	}
	n := int(int32(binary.LittleEndian.Uint32(b[:])))
	if n < 0 {
		return "", errType
	}
	u, err := h.chars(obj, 0, min(n, max), 0)
	if err != nil {
		return "", err
	}
	return string(utf16.Decode(u)), nil
}

// chars reads n characters of a string from its character off, following cons, sliced
// and thin strings depth levels deep at most.
func (h *heap) chars(obj uint64, off, n, depth int) ([]uint16, error) {
	if depth > 8 {
		return nil, errBounds
	}
	if n == 0 {
		return nil, nil
	}
	md := h.md
	t, err := h.typeOf(obj)
	if err != nil {
		return nil, err
	}
	if t >= md.FirstNonString {
		return nil, errType
	}
	switch t & md.StringRepMask {
	case 0: // sequential
		oneByte := t&md.StringEncMask == md.OneByteTag
		size := 2
		if oneByte {
			size = 1
		}
		raw := make([]byte, n*size)
		if err := h.m.ReadAt(raw, obj+uint64(md.SeqChars)+uint64(off*size)); err != nil {
			return nil, err
		}
		out := make([]uint16, n)
		for i := range out {
			if oneByte {
				out[i] = uint16(raw[i])
			} else {
				out[i] = binary.LittleEndian.Uint16(raw[2*i:])
			}
		}
		return out, nil
	case md.ThinTag:
		a, err := h.field(obj, md.ThinActual)
		if err != nil {
			return nil, err
		}
		return h.chars(a, off, n, depth+1)
	case md.SlicedTag:
		p, err := h.field(obj, md.SlicedParent)
		if err != nil {
			return nil, err
		}
		v, err := h.word(obj + uint64(md.SlicedOffset))
		if err != nil {
			return nil, err
		}
		o, ok := h.smi(v)
		if !ok || o < 0 {
			return nil, errType
		}
		return h.chars(p, off+int(o), n, depth+1)
	case md.ConsTag:
		first, err := h.field(obj, md.ConsFirst)
		if err != nil {
			return nil, err
		}
		second, err := h.field(obj, md.ConsSecond)
		if err != nil {
			return nil, err
		}
		var lb [4]byte
		if err := h.m.ReadAt(lb[:], first+uint64(md.StringLength)); err != nil {
			return nil, err
		}
		fl := int(int32(binary.LittleEndian.Uint32(lb[:])))
		var out []uint16
		if off < fl {
			a, err := h.chars(first, off, min(n, fl-off), depth+1)
			if err != nil {
				return nil, err
			}
			out = a
		}
		if rest := n - len(out); rest > 0 {
			b, err := h.chars(second, max(off-fl, 0), rest, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, b...)
		}
		return out, nil
	default: // external: its characters are behind a C++ object's virtual call
		return nil, fmt.Errorf("external string: %w", errType)
	}
}

// function is what naming a SharedFunctionInfo's frames needs.
type function struct {
	name      string
	file      string
	script    uint64
	start     int   // the function's start position in its script, or noPosition
	lineEnds  []int // positions of the script's line ends
	positions []position
}

func (f *function) line(pos int) int64 {
	if pos < 0 {
		pos = f.start
	}
	if pos < 0 || f.lineEnds == nil {
		return 0
	}
	return int64(sort.SearchInts(f.lineEnds, pos) + 1)
}

// sfi reads a SharedFunctionInfo: its name, script and bytecode's positions.
func (h *heap) sfi(sfi uint64, scripts func(script uint64) ([]int, string, error)) (*function, error) {
	md := h.md
	if !h.isType(sfi, md.TypeSFI) {
		return nil, errType
	}
	f := &function{start: noPosition}
	var err error
	if f.name, f.start, err = h.functionName(sfi); err != nil {
		return nil, err
	}
	if script, err := h.field(sfi, md.SFIScript); err == nil && h.isType(script, md.TypeScript) {
		f.script = script
		f.lineEnds, f.file, _ = scripts(script)
	}
	if bc := h.bytecode(sfi); bc != 0 {
		if t, err := h.bytecodePositions(bc); err == nil {
			f.positions, _ = h.positionsOf(t)
		}
	}
	return f, nil
}

// bytecodePositionsOffset: BytecodeArray's source_position_table, which the metadata does
// not name: after constant_pool and handler_table, checked to be a ByteArray when read.
const bytecodePositionsOffset = 32

// bytecode returns a function's BytecodeArray, or 0.
func (h *heap) bytecode(sfi uint64) uint64 {
	md := h.md
	fd, err := h.functionData(sfi)
	if err != nil {
		return 0
	}
	for range 3 {
		t, err := h.typeOf(fd)
		if err != nil {
			return 0
		}
		switch t {
		case md.TypeBytecodeArray:
			return fd
		case md.TypeCode: // baseline code: its bytecode beside it
			fd, err = h.codeDeopt(fd)
		case md.TypeInterpreterData:
			fd, err = h.field(fd, 8)
		default:
			return 0
		}
		if err != nil {
			return 0
		}
	}
	return 0
}

// functionName returns a SharedFunctionInfo's name and the start position of its
// function, from its ScopeInfo when compiled.
func (h *heap) functionName(sfi uint64) (string, int, error) {
	md := h.md
	v, err := h.word(sfi + uint64(md.SFINameOrScopeInfo))
	if err != nil {
		return "", noPosition, err
	}
	obj, ok := untag(v)
	if !ok {
		return "", noPosition, nil // no name
	}
	t, err := h.typeOf(obj)
	if err != nil {
		return "", noPosition, err
	}
	if t < md.FirstNonString {
		s, err := h.str(obj, maxString)
		return s, noPosition, err
	}
	if t != md.TypeScopeInfo {
		return "", noPosition, errType
	}
	return h.scopeInfoName(obj)
}

// The ScopeInfo's flags the name depends on (ScopeFlags of V8 11 and 12): whether a
// class variable's slot precedes the function variable's, whether the function names
// itself (function_variable, not NONE), whether an inferred name follows.
const (
	scopeHasSavedClassVariable = 1 << 10
	scopeFunctionVariableShift = 12
	scopeHasInferredName       = 1 << 14
)

// scopeInfoName reads a function's name from its ScopeInfo: the slots after the
// context locals' names and infos hold the function variable's name, then the inferred
// name, then (before V8 12.8) the function's position.
func (h *heap) scopeInfoName(si uint64) (string, int, error) {
	md := h.md
	slot := func(i int64) (uint64, error) { return h.word(si + uint64(md.FixedArrayLength+8*i)) }
	// ScopeInfo's slots start where a FixedArray's length is: flags first.
	fv, err := slot(0)
	if err != nil {
		return "", noPosition, err
	}
	// V8 12 keeps the flags as a Smi; V8 13 as a raw 32-bit field, which a Smi's zero low
	// half tells apart.
	flags := int64(fv)
	if fv == 0 || fv&0xffffffff != fv {
		var ok bool
		if flags, ok = h.smi(fv); !ok {
			return "", noPosition, errType
		}
	}
	// V8 12.8 moved the function's position to fixed slots after the context locals'
	// count, before the variables: the metadata's first_vars then leaves room for them.
	fixedPosition := md.ScopeInfoFirstVars == md.ScopeInfoContextLocals+3
	nv, err := slot(md.ScopeInfoContextLocals)
	if err != nil {
		return "", noPosition, err
	}
	n, ok := h.smi(nv)
	if !ok || n < 0 || n > maxScopeLocals {
		return "", noPosition, errType
	}
	names := n
	if n >= inlineLocalNames {
		names = 1
	}
	i := md.ScopeInfoFirstVars + names + n
	if flags&scopeHasSavedClassVariable != 0 {
		i++
	}
	var name string
	if flags>>scopeFunctionVariableShift&3 != 0 {
		if v, err := slot(i); err == nil {
			if p, ok := untag(v); ok {
				name, _ = h.str(p, maxString)
			}
		}
		i += 2
	}
	if flags&scopeHasInferredName != 0 {
		if name == "" {
			if v, err := slot(i); err == nil {
				if p, ok := untag(v); ok {
					name, _ = h.str(p, maxString)
				}
			}
		}
		i++
	}
	start := noPosition
	if fixedPosition {
		i = md.ScopeInfoContextLocals + 1
	}
	if v, err := slot(i); err == nil {
		if s, ok := h.smi(v); ok && s >= 0 {
			start = int(s)
		}
	}
	return name, start, nil
}

// script reads a Script's file name and line ends: V8's own when it computed them, else
// computed from its source.
func (h *heap) script(script uint64) ([]int, string, error) {
	md := h.md
	var file string
	if n, err := h.field(script, md.ScriptName); err == nil {
		file, _ = h.str(n, maxString)
	}
	if le, err := h.field(script, md.ScriptLineEnds); err == nil && h.isType(le, md.TypeFixedArray) {
		n, err := h.length(le)
		if err == nil && n <= maxLineEnds {
			raw := make([]byte, 8*n)
			if err := h.m.ReadAt(raw, le+uint64(md.FixedArrayData)); err == nil {
				ends := make([]int, n)
				for i := range ends {
					v, _ := h.smi(binary.LittleEndian.Uint64(raw[8*i:]))
					ends[i] = int(v)
				}
				return ends, file, nil
			}
		}
	}
	src, err := h.field(script, md.ScriptSource)
	if err != nil {
		return nil, file, err
	}
	var lb [4]byte
	if err := h.m.ReadAt(lb[:], src+uint64(md.StringLength)); err != nil {
		return nil, file, err
	}
	n := int(int32(binary.LittleEndian.Uint32(lb[:])))
	if n < 0 || n > maxSource {
		return nil, file, errBounds
	}
	chars, err := h.chars(src, 0, n, 0)
	if err != nil {
		return nil, file, err
	}
	var ends []int
	for i, c := range chars {
		if c == '\n' {
			ends = append(ends, i)
		}
	}
	return append(ends, n), file, nil
}

// position is one entry of a source position table: code from offset on (a bytecode
// offset, or a pc offset in machine code) comes from source position pos (V8's
// SourcePosition: script offset and inlining id).
type position struct {
	offset int
	pos    uint64
}

// positionsOf decodes a source position table t.
func (h *heap) positionsOf(t uint64) ([]position, error) {
	if !h.isByteArray(t) {
		return nil, errType
	}
	n, err := h.length(t)
	if err != nil || n > maxPositions {
		return nil, errBounds
	}
	raw := make([]byte, n)
	if err := h.m.ReadAt(raw, t+16); err != nil {
		return nil, err
	}
	return decodePositions(raw), nil
}

// plausiblePositions tells whether a decoded table reads as a bytecode's source positions:
// offsets in order, within its size, at script offsets.
func plausiblePositions(ps []position, size int) bool {
	if len(ps) == 0 {
		return false
	}
	last := -1
	for _, p := range ps {
		if p.offset < last || p.offset > size || scriptOffset(p.pos) < 0 {
			return false
		}
		last = p.offset
	}
	return true
}

// decodePositions decodes V8's source position table: pairs of zigzag VLQ deltas, the
// code offset's sign telling a statement, the source position a SourcePosition's bits.
func decodePositions(raw []byte) []position {
	var out []position
	var off, pos int64
	for i := 0; i < len(raw); {
		d1, n1 := vlq(raw[i:])
		if n1 == 0 {
			break
		}
		i += n1
		d2, n2 := vlq(raw[i:])
		if n2 == 0 {
			break
		}
		i += n2
		if d1 < 0 {
			d1 = -d1 - 1
		}
		off += d1
		pos += d2
		out = append(out, position{offset: int(off), pos: uint64(pos)})
	}
	return out
}

// vlq reads one of V8's VLQ numbers (zigzag, in at most 10 bytes) from the front of b.
func vlq(b []byte) (int64, int) { return leb128.ZigZag(b[:min(len(b), 10)]) }

// SourcePosition's fields (V8's source-position.h): bit 0 external, then the script
// offset + 1 in 30 bits, then the inlining id + 1 in 16.
func scriptOffset(p uint64) int { return int(p>>1&(1<<30-1)) - 1 }
func inliningID(p uint64) int   { return int(p>>31&(1<<16-1)) - 1 }

// at returns the entry of positions covering offset, or false.
func at(positions []position, offset int) (position, bool) {
	i := sort.Search(len(positions), func(i int) bool { return positions[i].offset > offset })
	if i == 0 {
		return position{}, false
	}
	return positions[i-1], true
}

// frame is one function at a pc: inlined frames have several.
type frame struct {
	sfi uint64
	pos int // script offset, or noPosition
}

// code finds the Code object whose instructions hold pc: the InstructionStream before pc,
// by its map, whose Code points back at the same instructions. An InstructionStream begins
// with its map and its Code; its instructions follow its header, at InstructionStart.
func (h *heap) code(pc uint64) (code, start uint64, err error) {
	md := h.md
	hdr := uint64(md.InstructionStart) // the InstructionStream's map and Code begin it
	buf := make([]byte, scanChunk)
	hi := pc &^ (codeAlignment - 1)
	for scanned := uint64(0); scanned < maxCodeScan && hi > scanChunk; scanned += scanChunk - hdr {
		lo := hi - scanChunk + hdr
		last := false
		if err := h.m.ReadAt(buf, lo-hdr); err != nil {
			// The code may begin its mapping: the page of hi is what there is.
			lo = max(hi&^4095, hdr+codeAlignment) + codeAlignment
			if lo > hi || h.m.ReadAt(buf[:hi-lo+hdr], lo-hdr) != nil {
				return 0, 0, err
			}
			last = true
		}
		for a := hi; a >= lo; a -= codeAlignment {
			i := a - hdr - (lo - hdr)
			mw := binary.LittleEndian.Uint64(buf[i:])
			cw := binary.LittleEndian.Uint64(buf[i+8:])
			m, ok1 := untag(mw)
			c, ok2 := untag(cw)
			if !ok1 || !ok2 {
				continue
			}
			if h.isMap != 0 && m != h.isMap {
				continue
			}
			if h.isMap == 0 && !h.isType(a-hdr, md.TypeInstructionStream) {
				continue
			}
			if h.owns(c, a) {
				h.isMap = m
				return c, a, nil
			}
		}
		if last {
			break
		}
		hi = lo - codeAlignment
	}
	return 0, 0, errors.New("no code object found before the pc")
}

// owns tells whether Code c points at instructions starting at start: the identity of
// the code the pc is in.
func (h *heap) owns(c, start uint64) bool {
	if !h.isType(c, h.md.TypeCode) {
		return false
	}
	var b [64]byte
	if h.m.ReadAt(b[:], c) != nil {
		return false
	}
	for i := 8; i < len(b); i += 8 {
		if binary.LittleEndian.Uint64(b[i:]) == start {
			return true
		}
	}
	return false
}

// baselineCode is jitFrames's answer for baseline code, whose function the code does not
// say: its BytecodeArray, which the function's must be.
type baselineCode struct{ bytecode uint64 }

func (b *baselineCode) Error() string { return "baseline code" }

// sharedInfo returns the SharedFunctionInfo an object of a Code's deoptimization data
// stands for: itself, or the one a SharedFunctionInfoWrapper (V8 13) holds.
func (h *heap) sharedInfo(obj uint64) (uint64, error) {
	md := h.md
	if h.isType(obj, md.TypeSFI) {
		return obj, nil
	}
	if md.TypeSFIWrapper < 0 || md.SFIWrapperShared == 0 || !h.isType(obj, md.TypeSFIWrapper) {
		return 0, errType
	}
	sfi, err := h.field(obj, md.SFIWrapperShared)
	if err != nil {
		return 0, err
	}
	if !h.isType(sfi, md.TypeSFI) {
		return 0, errType
	}
	return sfi, nil
}

// jitFrames returns the functions at a pc of optimized code, innermost first.
func (h *heap) jitFrames(pc uint64, ret bool) ([]frame, error) {
	md := h.md
	code, start, err := h.code(pc)
	if err != nil {
		return nil, err
	}
	deopt, err := h.codeDeopt(code)
	if err != nil {
		return nil, err
	}
	if h.isType(deopt, md.TypeBytecodeArray) {
		return nil, &baselineCode{bytecode: deopt}
	}
	if !h.isFixedArray(deopt) {
		return nil, fmt.Errorf("code without deoptimization data (a stub): %w", errType)
	}
	elem := func(i int64) (uint64, error) { return h.field(deopt, md.FixedArrayData+8*i) }
	outer, err := elem(md.DeoptSFI)
	if err != nil {
		return nil, err
	}
	if outer, err = h.sharedInfo(outer); err != nil {
		return nil, err
	}
	off := int(pc - start)
	if ret && off > 0 {
		off--
	}
	var positions []position
	if t, err := h.codePositions(code); err == nil {
		positions, _ = h.positionsOf(t)
	}
	p, ok := at(positions, off)
	if !ok {
		return []frame{{sfi: outer, pos: noPosition}}, nil
	}
	var inlining []byte
	var literals uint64
	var frames []frame
	for range maxInlined {
		id := inliningID(p.pos)
		if id < 0 {
			return append(frames, frame{sfi: outer, pos: scriptOffset(p.pos)}), nil
		}
		if inlining == nil {
			ip, err := elem(md.DeoptInliningPositions)
			if err != nil || !h.isByteArray(ip) {
				return nil, errType
			}
			n, err := h.length(ip)
			if err != nil || n > maxPositions {
				return nil, errBounds
			}
			inlining = make([]byte, n)
			if err := h.m.ReadAt(inlining, ip+16); err != nil {
				return nil, err
			}
			if literals, err = elem(md.DeoptLiterals); err != nil {
				return nil, err
			}
		}
		// InliningPosition: the call's SourcePosition, then the inlined function's index
		// among the literals.
		if (id+1)*16 > len(inlining) {
			return nil, errBounds
		}
		e := inlining[id*16:]
		fn := int64(int32(binary.LittleEndian.Uint32(e[8:])))
		n, err := h.length(literals)
		if err != nil || fn < 0 || fn >= int64(n) {
			return nil, errBounds
		}
		v, err := h.word(literals + uint64(md.FixedArrayData+8*fn))
		if err != nil {
			return nil, err
		}
		sfi, ok := untag(v &^ 2) // a weak reference has bit 1 set
		if !ok {
			return nil, errType
		}
		if sfi, err = h.sharedInfo(sfi); err != nil {
			return nil, err
		}
		frames = append(frames, frame{sfi: sfi, pos: scriptOffset(p.pos)})
		p = position{pos: binary.LittleEndian.Uint64(e[0:])}
	}
	return nil, errBounds
}
