package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/trace"
)

// node20 is the metadata of Node 20.20's V8 (11.3), as Inspect reads it from its v8dbg_*
// symbols; the fake heaps below are laid out by it.
var node20 = Metadata{FPContext: -8, FPFunction: -16, FPBytecodeOffset: -40, FPBytecodeArray: -32, FrameEntry: 1, FrameConstructEntry: 2,
	SmiShift: 32, BytecodeHeader: 54, MapInstanceType: 12, FixedArrayLength: 8, FixedArrayData: 16, FunctionShared: 24,
	SFINameOrScopeInfo: 16, SFIScript: 32, SFIFunction: 8, ScriptName: 16, ScriptSource: 8, ScriptLineEnds: 56,
	StringLength: 12, SeqChars: 16, ConsFirst: 16, ConsSecond: 24, SlicedParent: 16, SlicedOffset: 24, ThinActual: 16,
	CodeDeoptData: 16, CodePositions: 24, InstructionStart: 16, ScopeInfoContextLocals: 2, ScopeInfoFirstVars: 3,
	DeoptInliningPositions: 7, DeoptLiterals: 2, DeoptSFI: 6, FirstNonString: 128, StringRepMask: 7, StringEncMask: 8,
	ConsTag: 1, SlicedTag: 3, ThinTag: 5, OneByteTag: 8, TypeCode: 245, TypeInstructionStream: 252, TypeBytecodeArray: 191,
	TypeByteArray: 190, TypeFixedArray: 175, TypeScopeInfo: 261, TypeSFI: 262, TypeScript: 167, TypeWeakFixedArray: 240,
	TypeInterpreterData: 159, BytecodePositions: 32, TypeTrustedFixedArray: -1, TypeProtectedFixedArray: -1, TypeTrustedByteArray: -1}

// node22 is V8 12.4's metadata as Inspect reads it: the slots it does not name are found
// by type.
var node22 = func() Metadata {
	m := node20
	m.SFIFunction, m.CodeDeoptData, m.CodePositions, m.CodeNamedFrom = 0, 0, 0, 24
	m.BytecodePositions, m.BytecodeNamedTo, m.BytecodeHeader, m.InstructionStart = 0, 24, 64, 32
	m.TypeTrustedFixedArray, m.TypeProtectedFixedArray, m.TypeTrustedByteArray = 213, 211, 212
	return m
}()

// fakeHeap is a process's memory made of objects laid out as V8 does.
type fakeHeap struct {
	base uint64
	mem  []byte
	maps map[int64]uint64
}

func newFakeHeap() *fakeHeap {
	return &fakeHeap{base: 0x10000000, maps: map[int64]uint64{}}
}

func (f *fakeHeap) ReadAt(p []byte, addr uint64) error {
	if addr < f.base || addr+uint64(len(p)) > f.base+uint64(len(f.mem)) {
		return fmt.Errorf("read %d bytes at %#x: %w", len(p), addr, errors.New("unmapped"))
	}
	copy(p, f.mem[addr-f.base:])
	return nil
}

// alloc places size bytes, aligned to align, and returns their untagged address.
func (f *fakeHeap) alloc(size, align int) uint64 {
	for (len(f.mem)+int(f.base%uint64(align)))%align != 0 {
		f.mem = append(f.mem, 0)
	}
	a := f.base + uint64(len(f.mem))
	f.mem = append(f.mem, make([]byte, size)...)
	return a
}

func (f *fakeHeap) put64(addr, v uint64) { binary.LittleEndian.PutUint64(f.mem[addr-f.base:], v) }
func (f *fakeHeap) put32(addr uint64, v uint32) {
	binary.LittleEndian.PutUint32(f.mem[addr-f.base:], v)
}

// bytecodeOf returns the function data (tagged) of a SharedFunctionInfo f.function made:
// its BytecodeArray.
func (f *fakeHeap) bytecodeOf(sfi uint64) uint64 {
	return binary.LittleEndian.Uint64(f.mem[sfi-1+uint64(node20.SFIFunction)-f.base:])
}

func smi(v int64) uint64 { return uint64(v) << 32 }

// mapOf returns the tagged Map of an instance type.
func (f *fakeHeap) mapOf(t int64) uint64 {
	if m, ok := f.maps[t]; ok {
		return m
	}
	m := f.alloc(80, 8)
	binary.LittleEndian.PutUint16(f.mem[m-f.base+uint64(node20.MapInstanceType):], uint16(t))
	f.maps[t] = m + 1
	return m + 1
}

// object allocates an object of type t with the given 8-byte slots after its map, and
// returns it tagged.
func (f *fakeHeap) object(t int64, slots ...uint64) uint64 {
	a := f.alloc(8+8*len(slots), 8)
	f.put64(a, f.mapOf(t))
	for i, s := range slots {
		f.put64(a+8+8*uint64(i), s)
	}
	return a + 1
}

func (f *fakeHeap) str(s string) uint64 {
	a := f.alloc(16+len(s), 8)
	f.put64(a, f.mapOf(40)) // a sequential one-byte string
	f.put32(a+12, uint32(len(s)))
	copy(f.mem[a-f.base+16:], s)
	return a + 1
}

func (f *fakeHeap) byteArray(b []byte) uint64 {
	a := f.alloc(16+len(b), 8)
	f.put64(a, f.mapOf(node20.TypeByteArray))
	f.put64(a+8, smi(int64(len(b))))
	copy(f.mem[a-f.base+16:], b)
	return a + 1
}

func (f *fakeHeap) fixedArray(t int64, elems ...uint64) uint64 {
	return f.object(t, append([]uint64{smi(int64(len(elems)))}, elems...)...)
}

// encodePositions writes a source position table as V8 does.
func encodePositions(entries []position) []byte {
	var out []byte
	put := func(v int64) {
		u := uint64(v<<1) ^ uint64(v>>63)
		for u >= 0x80 {
			out = append(out, byte(u)|0x80)
			u >>= 7
		}
		out = append(out, byte(u))
	}
	var off, pos int64
	for _, e := range entries {
		put(-(int64(e.offset) - off) - 1) // not a statement
		put(int64(e.pos) - pos)
		off, pos = int64(e.offset), int64(e.pos)
	}
	return out
}

func sourcePosition(scriptOffset, inlining int) uint64 {
	return uint64(scriptOffset+1)<<1 | uint64(inlining+1)<<31
}

// function makes a SharedFunctionInfo named name (in its ScopeInfo, as compiled
// functions keep it) of script, whose function starts at start.
func (f *fakeHeap) function(name string, script uint64, start int) uint64 {
	// ScopeInfo: flags (a function scope naming itself, with an inferred name slot),
	// parameter count, context locals (none), the function variable's name and slot,
	// the inferred name, the position.
	flags := int64(2 | 1<<scopeFunctionVariableShift | scopeHasInferredName)
	si := f.object(node20.TypeScopeInfo, smi(flags), smi(1), smi(0), f.str(name), smi(-1), f.object(5), smi(int64(start)), smi(int64(start+20)))
	bc := f.object(node20.TypeBytecodeArray, smi(8), 0, 0, f.byteArray(encodePositions([]position{{0, sourcePosition(start+3, -1)}, {4, sourcePosition(start+40, -1)}})))
	// SharedFunctionInfo: map, function_data, name_or_scope_info, …, script_or_debug_info.
	return f.object(node20.TypeSFI, bc, si, 0, script)
}

func TestJITFramesInlined(t *testing.T) {
	f := newFakeHeap()
	src := "function leaf() {}\nfunction middle() { leaf() }\nfunction outer() { middle() }\n"
	script := f.object(node20.TypeScript, f.str(src), f.str("/app/x.js"), 0, 0, 0, 0, f.object(5))
	leaf := f.function("leaf", script, 0)
	middle := f.function("middle", script, 19)
	outer := f.function("outer", script, 48)
	// outer inlined middle (inlining 0, called at 60), which inlined leaf (inlining 1,
	// called at 40 in middle).
	inl := make([]byte, 32)
	binary.LittleEndian.PutUint64(inl[0:], sourcePosition(60, -1))
	binary.LittleEndian.PutUint32(inl[8:], 1)
	binary.LittleEndian.PutUint64(inl[16:], sourcePosition(40, 0))
	binary.LittleEndian.PutUint32(inl[24:], 0)
	literals := f.fixedArray(node20.TypeWeakFixedArray, leaf|2, middle) // a weak reference to leaf
	deopt := f.fixedArray(node20.TypeFixedArray, 0, smi(2), literals, 0, 0, 0, outer, f.byteArray(inl))
	positions := f.byteArray(encodePositions([]position{{0, sourcePosition(50, -1)}, {16, sourcePosition(5, 1)}, {32, sourcePosition(62, -1)}}))
	// The instructions: an InstructionStream (map, code) before them, 64-aligned; its Code
	// points back at them.
	is := f.alloc(16+256, 64) // instructions at is+16... aligned below
	start := is + 16
	for start%64 != 0 {
		is++
		start++
	}
	code := f.object(node20.TypeCode, 0, deopt, positions, is+1, start)
	f.put64(is, f.mapOf(node20.TypeInstructionStream))
	f.put64(is+8, code)

	n := NewNamer(NamerConfig{Images: fixedImage{}, Memory: func(uint32) Memory { return f }})
	h := &heap{m: f, md: &node20}
	lines, err := n.jitLines(h, 1, 1, start+20, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []trace.Line{
		{Function: "leaf", SystemName: "leaf", File: "/app/x.js", Line: 1},
		{Function: "middle", SystemName: "middle", File: "/app/x.js", Line: 2},
		{Function: "outer", SystemName: "outer", File: "/app/x.js", Line: 3},
	}
	if !slices.Equal(lines, want) {
		t.Errorf("inlined frames %v, want %v", lines, want)
	}
	// Before any inlining, outer alone.
	lines, err = n.jitLines(h, 1, 1, start+1, false)
	if err != nil || len(lines) != 1 || lines[0].Function != "outer" || lines[0].Line != 3 {
		t.Errorf("outer's own code: %v, %v", lines, err)
	}
	// The kernel's record of the sampled frame's function must agree with the code's.
	for _, c := range []struct {
		fn    uint64
		named bool
	}{{outer, true}, {leaf, false}} {
		n := NewNamer(NamerConfig{Images: fixedImage{}, Memory: func(uint32) Memory { return f }, Functions: fakeFunctions{start + 20: c.fn}})
		if _, err := n.jitLines(h, 1, 1, start+20, true); (err == nil) != c.named {
			t.Errorf("sampled frame's function %#x: %v, want named %v", c.fn, err, c.named)
		}
	}
	// A pc whose instructions are not a Code's is not named.
	f.put64(is+8, outer)
	if _, err := (&heap{m: f, md: &node20}).jitFrames(start+20, true); err == nil {
		t.Error("a pc whose InstructionStream points at no Code was named")
	}
}

type fixedImage struct{}

func (fixedImage) Image(pid uint32) *Image {
	return &Image{v8: &V8{Meta: node20}}
}

func TestInterpretedFrame(t *testing.T) {
	f := newFakeHeap()
	src := "// head\nfunction a() {\n  x();\n  y();\n  z();\n  w();\n  v();\n}\n"
	script := f.object(node20.TypeScript, f.str(src), f.str("/app/y.js"), 0, 0, 0, 0, f.object(5))
	sfi := f.function("a", script, 8)
	n := NewNamer(NamerConfig{Images: fixedImage{}, Memory: func(uint32) Memory { return f }})
	code, off := DecodeFrame(payloadOf(t, EncodeBytecodeFrame(sfi, uint32(node20.BytecodeHeader-1+5))))
	loc := &trace.Location{Interp: &trace.InterpFrame{PID: 1, Image: 1, Code: code, Offset: off}}
	lines, ok := n.Name(loc)
	// Offset 5 is past the entry at 4: script offset 8+40, on line 6.
	if !ok || len(lines) != 1 || lines[0] != (trace.Line{Function: "a", SystemName: "a", File: "/app/y.js", Line: 6}) {
		t.Errorf("interpreted frame named %v, %v", lines, ok)
	}
	// Not a SharedFunctionInfo: [v8], counted unnamed.
	code, off = DecodeFrame(payloadOf(t, EncodeBytecodeFrame(script, 60)))
	if lines, ok := n.Name(&trace.Location{Interp: &trace.InterpFrame{PID: 1, Image: 1, Code: code, Offset: off}}); !isV8(lines, ok) {
		t.Errorf("a script named as a function: %v", lines)
	}
	if st := n.Stats(); st.Named != 1 || st.Unnamed != 1 {
		t.Errorf("stats %+v, want 1 named, 1 unnamed", st)
	}
}

// TestInterpretedFrameByBytecode: an interpreted frame the kernel records by its
// BytecodeArray is named by the function the kernel found running it, only while that
// function's bytecode is the array: a function at the address of one collected, or one
// whose array was collected and its address given to another's, names nothing.
func TestInterpretedFrameByBytecode(t *testing.T) {
	f := newFakeHeap()
	src := "// head\nfunction a() {\n  x();\n  y();\n  z();\n  w();\n  v();\n}\n"
	script := f.object(node20.TypeScript, f.str(src), f.str("/app/y.js"), 0, 0, 0, 0, f.object(5))
	sfi := f.function("a", script, 8)
	other := f.function("other", script, 8)
	bytecode := f.bytecodeOf(sfi)
	frame := payloadOf(t, EncodeBytecodeArrayFrame(bytecode, uint32(node20.BytecodeHeader-1+5)))
	for _, c := range []struct {
		what  string
		fns   FunctionFinder
		named bool
	}{
		{"the kernel's function runs the array", fakeFunctions{bytecode: sfi}, true},
		{"the kernel's function has other bytecode", fakeFunctions{bytecode: other}, false},
		{"the kernel's function is not one", fakeFunctions{bytecode: script}, false},
		{"the kernel has no function for the array", fakeFunctions{}, false},
		{"no kernel", nil, false},
	} {
		n := NewNamer(NamerConfig{Images: fixedImage{}, Memory: func(uint32) Memory { return f }, Functions: c.fns})
		code, off := DecodeFrame(frame)
		lines, ok := n.Name(&trace.Location{Interp: &trace.InterpFrame{PID: 1, Image: 1, Code: code, Offset: off}})
		// Offset 5 is past the entry at 4: script offset 8+40, on line 6.
		named := ok && len(lines) == 1 && lines[0] == (trace.Line{Function: "a", SystemName: "a", File: "/app/y.js", Line: 6})
		if named != c.named || !named && !isV8(lines, ok) {
			t.Errorf("%s: named %v, %v; want named %v", c.what, lines, ok, c.named)
		}
		if st := n.Stats(); !c.named && st.Unnamed != 1 {
			t.Errorf("%s: stats %+v, want the frame counted unnamed", c.what, st)
		}
	}
}

func payloadOf(t *testing.T, frame uint64) uint64 {
	rt, payload, ok := trace.DecodeInterpFrame(frame)
	if !ok || rt != Number {
		t.Fatalf("frame %#x: runtime %d, %v", frame, rt, ok)
	}
	return payload
}

func TestDecodeFrame(t *testing.T) {
	code, off := DecodeFrame(payloadOf(t, EncodeJITFrame(0x7f0012345678, true)))
	if code != jitFlag|retFlag|0x7f0012345678 || off != 0 {
		t.Errorf("JIT frame decoded as %#x, %d", code, off)
	}
	code, off = DecodeFrame(payloadOf(t, EncodeBytecodeFrame(0x3a0012345679, 77)))
	if code != 0x3a0012345678 || off != 77 {
		t.Errorf("bytecode frame decoded as %#x, %d", code, off)
	}
	code, off = DecodeFrame(payloadOf(t, EncodeBytecodeArrayFrame(0x3a0012345679, 78)))
	if code != arrayFlag|0x3a0012345678 || off != 78 {
		t.Errorf("bytecode array frame decoded as %#x, %d", code, off)
	}
	if _, off = DecodeFrame(payloadOf(t, EncodeBytecodeFrame(0x3a0012345679, 1<<20))); off != offsetMask {
		t.Errorf("a bytecode offset past the bits saturates at %d, got %d", offsetMask, off)
	}
}

func TestDecodePositions(t *testing.T) {
	want := []position{{0, sourcePosition(3, -1)}, {7, sourcePosition(1000, 2)}, {300, sourcePosition(12, -1)}}
	if got := decodePositions(encodePositions(want)); !slices.Equal(got, want) {
		t.Errorf("decoded %v, want %v", got, want)
	}
	// The first entry of a TurboFan table read from Node 20: pc offset 1, script offset 12.
	got := decodePositions([]byte{0x03, 0x34})
	if len(got) != 1 || got[0].offset != 1 || scriptOffset(got[0].pos) != 12 || inliningID(got[0].pos) != -1 {
		t.Errorf("decoded %v", got)
	}
	// Truncated input ends the table.
	if got := decodePositions([]byte{0x80, 0x80}); len(got) != 0 {
		t.Errorf("truncated table decoded as %v", got)
	}
}

func TestCodeRange(t *testing.T) {
	maps := `00400000-00b6f000 r--p 00000000 fe:00 247580 /usr/bin/node
7f10f8000000-7f10f8002000 rw-p 00000000 00:00 0 
7f10f8002000-7f10f8003000 ---p 00000000 00:00 0 
7f10f8003000-7f10f803f000 rwxp 00000000 00:00 0 
7f10f803f000-7f1117e40000 ---p 00000000 00:00 0 
7f1117e40000-7f1117e41000 r-xp 014c4000 fe:00 247580 /usr/bin/node
7f1117e41000-7f1117e50000 rw-p 00000000 00:00 0 
`
	got := codeRange([]byte(maps), [2]uint64{0x7f10f8003000, 0x7f10f803f000})
	if got != [2]uint64{0x7f10f8000000, 0x7f1117e40000} {
		t.Errorf("code range %#x", got)
	}
	if got := codeRange(nil, [2]uint64{1, 2}); got != [2]uint64{1, 2} {
		t.Errorf("without maps: %#x", got)
	}
}

// TestNamerBounds: what the namer keeps stays within MaxBytes, however much is read.
func TestNamerBounds(t *testing.T) {
	f := newFakeHeap()
	src := "function a() {}\n"
	var sfis []uint64
	for i := range 200 {
		script := f.object(node20.TypeScript, f.str(src), f.str(fmt.Sprintf("/app/%d.js", i)), 0, 0, 0, 0, f.object(5))
		sfis = append(sfis, f.function(fmt.Sprintf("fn%d", i), script, 0))
	}
	n := NewNamer(NamerConfig{Images: fixedImage{}, Memory: func(uint32) Memory { return f }, MaxBytes: 8 << 10})
	for _, sfi := range sfis {
		code, off := DecodeFrame(payloadOf(t, EncodeBytecodeFrame(sfi, 60)))
		if _, ok := n.Name(&trace.Location{Interp: &trace.InterpFrame{PID: 1, Image: 1, Code: code, Offset: off}}); !ok {
			t.Fatalf("function %#x unnamed", sfi)
		}
	}
	if st := n.Stats(); st.CachedBytes > 8<<10 || st.Cached == 0 || st.Cached >= 200 {
		t.Errorf("kept %d entries, %d bytes; want some, within 8 KiB", st.Cached, st.CachedBytes)
	}
}

// TestNamerIdle: what no stack showed for MaxIdle goes when later code is read; what
// stacks keep showing stays, read once.
func TestNamerIdle(t *testing.T) {
	f := newFakeHeap()
	script := f.object(node20.TypeScript, f.str("function a() {}\n"), f.str("/app/a.js"), 0, 0, 0, 0, f.object(5))
	var codes []uint64
	for i := range 40 {
		code, _ := DecodeFrame(payloadOf(t, EncodeBytecodeFrame(f.function(fmt.Sprintf("fn%d", i), script, 0), 60)))
		codes = append(codes, code)
	}
	clock := time.Unix(1000, 0)
	n := NewNamer(NamerConfig{Images: fixedImage{}, Memory: func(uint32) Memory { return f }, MaxIdle: time.Minute,
		Recheck: time.Hour, now: func() time.Time { return clock }})
	name := func(code uint64) {
		t.Helper()
		if _, ok := n.Name(&trace.Location{Interp: &trace.InterpFrame{PID: 1, Image: 1, Code: code, Offset: 60}}); !ok {
			t.Fatalf("code %#x unnamed", code)
		}
	}
	name(codes[0]) // shown by stacks all along
	for i, code := range codes[1:] {
		clock = clock.Add(5 * time.Second)
		n.SeenCode(1, 1, codes[0])
		name(code)
		if st := n.Stats(); i >= 12 && st.Cached != 13 {
			t.Fatalf("after %d s: %d cached; want the steady code and the last 12 of 5 s each", 5*(i+1), st.Cached)
		}
	}
	if st := n.Stats(); st.Read != 40 || st.Idle != 40-13 {
		t.Errorf("read %d, let go %d idle; want 40 read once each, 27 idle", st.Read, st.Idle)
	}
}

type fakeFunctions map[uint64]uint64

func (f fakeFunctions) FunctionAt(pid uint32, code uint64) (uint64, bool) {
	v, ok := f[code]
	return v, ok
}

// TestBaselineFrame: a pc of baseline code is named by the function the kernel found in
// its frame, only when that function's bytecode is the code's.
func TestBaselineFrame(t *testing.T) {
	f := newFakeHeap()
	src := "\n\nfunction b() { return 1 }\n"
	script := f.object(node20.TypeScript, f.str(src), f.str("/app/b.js"), 0, 0, 0, 0, f.object(5))
	sfi := f.function("b", script, 2)
	other := f.function("other", script, 2)
	bytecode := f.bytecodeOf(sfi)
	is := f.alloc(16+256, 64)
	start := is + 16
	for start%64 != 0 {
		is++
		start++
	}
	code := f.object(node20.TypeCode, 0, bytecode, 0, is+1, start)
	f.put64(is, f.mapOf(node20.TypeInstructionStream))
	f.put64(is+8, code)
	pc := start + 8
	for _, c := range []struct {
		found uint64
		named bool
	}{{sfi, true}, {other, false}, {0, false}} {
		fns := fakeFunctions{}
		if c.found != 0 {
			fns[pc] = c.found
		}
		n := NewNamer(NamerConfig{Images: fixedImage{}, Memory: func(uint32) Memory { return f }, Functions: fns})
		lines, err := n.jitLines(&heap{m: f, md: &node20}, 1, 1, pc, true)
		if named := err == nil && len(lines) == 1 && lines[0].Function == "b" && lines[0].Line == 3; named != c.named {
			t.Errorf("kernel's function %#x: %v, %v; want named %v", c.found, lines, err, c.named)
		}
	}
}

// V8 12's slots the metadata does not name are found by the types of what they hold: a
// function's data, a Code's deoptimization data and positions; a BytecodeArray's
// positions are learnt beside a handler table, never from a table that could be one.
func TestUnnamedSlotsByType(t *testing.T) {
	md := node22
	f := newFakeHeap()
	h := &heap{m: f, md: &md}
	untagged := func(v uint64) uint64 { return v - 1 }
	positions := encodePositions([]position{{0, sourcePosition(10, -1)}, {3, sourcePosition(14, -1)}})
	if len(positions)%16 == 0 {
		t.Fatal("the positions would read as a handler table")
	}
	trusted := func(b []byte) uint64 {
		a := untagged(f.byteArray(b))
		f.put64(a, f.mapOf(md.TypeTrustedByteArray))
		return a + 1
	}
	handlers := trusted(make([]byte, 16)) // one try block
	// BytecodeArray: length, wrapper, handler table, positions, constant pool.
	bytecode := func(slots ...uint64) uint64 {
		return f.object(md.TypeBytecodeArray, append([]uint64{smi(8), f.object(300)}, slots...)...)
	}
	withTry := bytecode(handlers, trusted(positions), f.fixedArray(md.TypeTrustedFixedArray))
	if _, err := h.bytecodePositions(untagged(withTry)); err != nil || h.bcPositions != 32 {
		t.Errorf("positions beside a handler table: slot %d, %v; want 32", h.bcPositions, err)
	}
	h.bcPositions = 0
	// A handler table and no positions: nothing learnt, nothing read.
	noPositions := bytecode(trusted(make([]byte, 32)), trusted(nil), f.fixedArray(md.TypeTrustedFixedArray))
	if p, err := h.bytecodePositions(untagged(noPositions)); err == nil || h.bcPositions != 0 {
		t.Errorf("a handler table taken for positions: %#x, slot %d", p, h.bcPositions)
	}

	// SharedFunctionInfo: its data, then name or scope info at 16.
	sfi := untagged(f.object(md.TypeSFI, withTry, f.str("walrus")))
	if fd, err := h.functionData(sfi); err != nil || fd != untagged(withTry) {
		t.Errorf("function data %#x, %v", fd, err)
	}
	// Code: deoptimization data and positions before its first named field (24).
	deopt := f.fixedArray(md.TypeTrustedFixedArray, smi(0))
	codePositions := trusted(positions)
	code := untagged(f.object(md.TypeCode, deopt, codePositions))
	if d, err := h.codeDeopt(code); err != nil || d != untagged(deopt) {
		t.Errorf("deoptimization data %#x, %v", d, err)
	}
	if p, err := h.codePositions(code); err != nil || p != untagged(codePositions) {
		t.Errorf("positions %#x, %v", p, err)
	}
	// Two slots of a kind: neither is taken.
	twice := untagged(f.object(md.TypeCode, codePositions, codePositions))
	if p, err := h.codePositions(twice); err == nil {
		t.Errorf("one of two byte arrays taken for positions: %#x", p)
	}
}

// isV8 tells the name of a frame that could not be named: [v8], never its raw value.
func isV8(lines []trace.Line, ok bool) bool {
	return ok && len(lines) == 1 && lines[0] == trace.Line{Function: "[v8]", SystemName: "[v8]"}
}

// failingMemory fails its first reads, as a process's memory does while V8 installs or
// moves what the frame shows.
type failingMemory struct {
	Memory
	fails int
}

func (m *failingMemory) ReadAt(p []byte, addr uint64) error {
	if m.fails > 0 {
		m.fails--
		return errors.New("not there yet")
	}
	return m.Memory.ReadAt(p, addr)
}

// TestReadFailsOnce: a function whose first read fails (sampled before V8 finished with
// it) is read again once Retry has passed and named; before that it shows as [v8].
func TestReadFailsOnce(t *testing.T) {
	f := newFakeHeap()
	src := "// head\nfunction a() {\n  x();\n  y();\n  z();\n  w();\n  v();\n}\n"
	script := f.object(node20.TypeScript, f.str(src), f.str("/app/y.js"), 0, 0, 0, 0, f.object(5))
	sfi := f.function("a", script, 8)
	mem := &failingMemory{Memory: f, fails: 1}
	now := time.Unix(1000, 0)
	n := NewNamer(NamerConfig{Images: fixedImage{}, Memory: func(uint32) Memory { return mem }, now: func() time.Time { return now }})
	code, off := DecodeFrame(payloadOf(t, EncodeBytecodeFrame(sfi, uint32(node20.BytecodeHeader-1+5))))
	loc := func() *trace.Location {
		return &trace.Location{Interp: &trace.InterpFrame{PID: 1, Image: 1, Code: code, Offset: off}}
	}
	if lines, ok := n.Name(loc()); !isV8(lines, ok) {
		t.Fatalf("a failed read named %v, %v; want [v8]", lines, ok)
	}
	now = now.Add(DefaultRetry)
	lines, ok := n.Name(loc())
	if !ok || len(lines) != 1 || lines[0].Function != "a" || lines[0].Line != 6 {
		t.Errorf("after Retry: %v, %v; want a at line 6", lines, ok)
	}
	if st := n.Stats(); st.Retries != 1 || st.ReadErrors != 1 {
		t.Errorf("stats %+v, want 1 retry of 1 read error", st)
	}
}
