package jvm

import (
	"encoding/binary"
	"testing"
	"unicode/utf8"

	"github.com/sonde-profiler/sonde/trace"
)

// FuzzStreams decodes line number tables and scope chains from arbitrary bytes: an
// nmethod's debug info and a method's line table are read from the process, which can
// hold anything, and decoding must end in pairs, scopes or an error, never a panic or an
// unbounded loop.
func FuzzStreams(f *testing.F) {
	data, off := encodeScopes([]Scope{{MethodIndex: 2, BCI: 3}, {MethodIndex: 1, BCI: 5}}, 1)
	f.Add(data, uint16(off), true)
	f.Add(encodeLines([]LinePair{{0, 18}, {2, 19}, {300, 4}}, 0), uint16(0), false)
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, uint16(1), false)
	f.Fuzz(func(t *testing.T, b []byte, off uint16, jdk20 bool) {
		x := byte(0)
		if jdk20 {
			x = 1
		}
		pairs, n, _ := DecodeLineTable(b, x)
		if n > len(b) || len(pairs) > maxLinePairs {
			t.Fatalf("decoded %d pairs from %d of %d bytes", len(pairs), n, len(b))
		}
		LineAt(pairs, int32(off))
		if scopes, _ := DecodeScopes(b, int(off), x, -1); len(scopes) > maxInlineDepth {
			t.Fatalf("%d scopes", len(scopes))
		}
		modifiedUTF8(b)
	})
}

// FuzzTables reads HotSpot's serviceability tables out of arbitrary memory: the globals
// that describe the tables' layout, the tables and the strings they point to are all the
// process's.
func FuzzTables(f *testing.F) {
	// A well-formed start: one struct entry, one type, one constant of each kind.
	const base = 0x20000000
	mem := make([]byte, 1024)
	put := func(off int, v uint64) { binary.LittleEndian.PutUint64(mem[off:], v) }
	// Globals at 0..191: table pointers, entry field offsets, strides.
	vals := []uint64{base + 256, 0, 8, 16, 24, 32, 40, 48, // structs: table, typeName, fieldName, typeString, isStatic, offset, address, stride
		base + 512, 0, 8, 16, 20, 24, 32, 40, // types: table, name, super, isOop, isInt, isUnsigned, size, stride
		base + 640, 0, 8, 16, base + 704, 0, 8, 16} // ints, longs: table, name, value, stride
	for i, v := range vals {
		put(i*8, v)
	}
	copy(mem[900:], "CodeBlob\x00_name\x00const char*\x00")
	put(256, base+900)
	put(264, base+909)
	put(272, base+915)
	put(296, 96)
	put(512, base+900)
	put(544, 104)
	put(640, base+909)
	put(648, 7)
	put(704, base+915)
	put(712, 9)
	f.Add(mem)
	f.Fuzz(func(t *testing.T, mem []byte) {
		if len(mem) > 1<<16 {
			return
		}
		syms := &Symbols{}
		addrs := []*uint64{&syms.Structs, &syms.StructTypeName, &syms.StructFieldName, &syms.StructTypeString,
			&syms.StructIsStatic, &syms.StructOffset, &syms.StructAddress, &syms.StructStride,
			&syms.Types, &syms.TypeTypeName, &syms.TypeSuperclassName, &syms.TypeIsOop, &syms.TypeIsInteger,
			&syms.TypeIsUnsigned, &syms.TypeSize, &syms.TypeStride,
			&syms.IntConstants, &syms.IntName, &syms.IntValue, &syms.IntStride,
			&syms.LongConstants, &syms.LongName, &syms.LongValue, &syms.LongStride}
		for i, a := range addrs {
			*a = base + uint64(i)*8
		}
		vs, err := ReadVMStructs(&fakeMem{base: base, mem: mem}, syms, 0)
		if err == nil {
			NewLayout(vs)
		}
	})
}

// FuzzNamer names pcs and interpreted frames of a fake JVM whose memory the fuzzer
// overwrites in part: every pointer, length and offset HotSpot hands over may lie.
func FuzzNamer(f *testing.F) {
	f.Add(uint32(0), []byte{0xFF}, false)
	f.Add(uint32(100), []byte{1, 2, 3, 4, 5, 6, 7, 8}, true)
	f.Fuzz(func(t *testing.T, at uint32, patch []byte, jdk25 bool) {
		jdk := 17
		if jdk25 {
			jdk = 25
		}
		fj := newFakeJVM(jdk)
		p := fj.process(t)
		if len(patch) > 4096 {
			return
		}
		at %= uint32(len(fj.mem))
		copy(fj.mem[at:], patch)
		n := NewNamer(p, NamerConfig{MaxBytes: 4096})
		for _, pc := range []uint64{fj.callPC, fj.ownPC, fj.stub + 100, fj.heapLow, fj.codeBegin} {
			if frames, _ := n.Compiled(pc); len(frames) == 0 || len(frames) > maxInlineDepth {
				t.Fatalf("pc %#x: %d frames", pc, len(frames))
			}
		}
		n.Interpreted(fj.outer, fj.outerCM+60)
		n.InterpretedBCI(fj.leaf, 3)
		p.Blobs(func(*Blob) bool { return true })
		p.Interpreter()
		p.Bounds()
	})
}

// FuzzRuntime names frames as the kernel writes them, any 58 bits, against a fake JVM
// whose memory the fuzzer overwrites in part: every frame is named, by a method or as
// [jit], in valid UTF-8 and at most as deep as inlining goes, and never panics.
func FuzzRuntime(f *testing.F) {
	// Seeds of JDK 25's fake: JDK 17's places its blobs a little apart.
	fj := newFakeJVM(25)
	for _, fr := range []uint64{EncodeCodeFrame(fj.callPC, true, 42), EncodeCodeFrame(fj.ownPC, false, 42),
		EncodeInterpretedFrame(fj.outer, 6), EncodeInterpretedFrame(fj.leaf, BCIUnknown)} {
		f.Add(fr, uint32(0), []byte{}, true)
	}
	f.Add(EncodeCodeFrame(fj.callPC, true, 42), uint32(1000), []byte{0xFF, 0xFF, 0xFF, 0xFF}, false)
	f.Fuzz(func(t *testing.T, frame uint64, at uint32, patch []byte, jdk25 bool) {
		if len(patch) > 4096 {
			return
		}
		jdk := 17
		if jdk25 {
			jdk = 25
		}
		fj := newFakeJVM(jdk)
		p := fj.process(t)
		at %= uint32(len(fj.mem))
		copy(fj.mem[at:], patch)
		r := New(Config{Kernel: newFakeKernel(), MaxBytes: 1 << 16})
		r.tracker.cfg.find = func(uint32, *trace.Mapping) (*Process, error) { return p, nil }
		r.ProcessMappings(fakePID, 1, fakeLib(2))
		payload := frame & (1<<trace.InterpPayloadBits - 1)
		code, off := r.DecodeFrame(payload)
		r.tracker.namer(fakePID, 1, true) // as SeenCode binds the exec's first image
		loc := &trace.Location{Kind: trace.FrameInterp, Interp: &trace.InterpFrame{Runtime: Number, PID: fakePID, Image: 1, Code: code, Offset: off}}
		lines, ok := r.Name(loc)
		if !ok || len(lines) == 0 || len(lines) > maxInlineDepth {
			t.Fatalf("frame %#x: %d lines, %v", frame, len(lines), ok)
		}
		for _, l := range lines {
			if l.Function == "" || !utf8.ValidString(l.Function) || !utf8.ValidString(l.SystemName) || !utf8.ValidString(l.File) || l.Line < 0 {
				t.Fatalf("frame %#x: line %+v", frame, l)
			}
		}
	})
}
