package jvm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// fakeMem is a process's memory: one region from base.
type fakeMem struct {
	base uint64
	mem  []byte
}

func (f *fakeMem) ReadAt(p []byte, addr uint64) error {
	if addr < f.base || addr-f.base > uint64(len(f.mem)) || uint64(len(p)) > uint64(len(f.mem))-(addr-f.base) {
		return fmt.Errorf("read %d bytes at %#x: %w", len(p), addr, errors.New("unmapped"))
	}
	copy(p, f.mem[addr-f.base:])
	return nil
}

func (f *fakeMem) alloc(size int) uint64 {
	for len(f.mem)%16 != 0 {
		f.mem = append(f.mem, 0)
	}
	a := f.base + uint64(len(f.mem))
	f.mem = append(f.mem, make([]byte, size)...)
	return a
}

func (f *fakeMem) bytes(addr uint64, b []byte) { copy(f.mem[addr-f.base:], b) }
func (f *fakeMem) u64(addr, v uint64)          { binary.LittleEndian.PutUint64(f.mem[addr-f.base:], v) }
func (f *fakeMem) u32(addr uint64, v uint32)   { binary.LittleEndian.PutUint32(f.mem[addr-f.base:], v) }
func (f *fakeMem) u16(addr uint64, v uint16)   { binary.LittleEndian.PutUint16(f.mem[addr-f.base:], v) }

func (f *fakeMem) cstring(s string) uint64 {
	a := f.alloc(len(s) + 1)
	f.bytes(a, []byte(s))
	return a
}

func (f *fakeMem) symbol(s string) uint64 {
	a := f.alloc(8 + len(s))
	f.u16(a+4, uint16(len(s)))
	f.bytes(a+6, []byte(s))
	return a
}

// fakeJVM is a HotSpot's memory as sonde reads it, laid out as JDK 17 or JDK 25 lays it
// (the offsets are those builds' own, from their tables): a code heap of one nmethod and
// one stub, a class with two methods, the nmethod's debug info inlining one into the
// other.
type fakeJVM struct {
	*fakeMem
	jdk           int
	vs            *VMStructs
	heapLow       uint64
	nm, stub      uint64 // blobs
	codeBegin     uint64
	outer, leaf   uint64 // Method*
	outerCM       uint64
	holder        uint64
	callPC, ownPC uint64 // a pc with both scopes, one with the outer's only
	outerName     uint64 // the symbol naming outer
}

// Offsets of the fake's structures.
const (
	fakeCPSize     = 72
	fakeMethodSize = 88
	fakeCodeSize   = 20
	fakeSegLog2    = 7
)

func newFakeJVM(jdk int) *fakeJVM {
	f := &fakeJVM{fakeMem: &fakeMem{base: 0x10000000}, jdk: jdk}
	vs := &VMStructs{Fields: map[string]map[string]Field{}, Types: map[string]Type{}, IntConstants: map[string]int32{},
		LongConstants: map[string]uint64{}}
	f.vs = vs
	field := func(typ, name, ctype string, off uint64) {
		if vs.Fields[typ] == nil {
			vs.Fields[typ] = map[string]Field{}
		}
		vs.Fields[typ][name] = Field{Type: ctype, Offset: off}
	}
	static := func(typ, name, ctype string, addr uint64) {
		if vs.Fields[typ] == nil {
			vs.Fields[typ] = map[string]Field{}
		}
		vs.Fields[typ][name] = Field{Type: ctype, Static: true, Address: addr}
	}
	for name, size := range map[string]uint64{"int": 4, "u1": 1, "u2": 2, "u4": 4, "size_t": 8, "uint32_t": 4, "bool": 1,
		"int16_t": 2, "CodeBlobKind": 1, "CompLevel": 1, "PcDesc": 16, "Method": fakeMethodSize, "ConstantPool": fakeCPSize} {
		vs.Types[name] = Type{Size: size}
	}
	jdk25 := jdk >= 23
	heapBlock := uint64(16)
	if jdk25 {
		heapBlock = 8
	}
	vs.Types["HeapBlock"] = Type{Size: heapBlock}
	cmSize := uint64(48)
	if jdk25 {
		cmSize = 56
	}
	vs.Types["ConstMethod"] = Type{Size: cmSize}
	vs.IntConstants["InvocationEntryBci"] = -1
	vs.IntConstants["frame::interpreter_frame_sender_sp_offset"] = -1
	vs.IntConstants["frame::interpreter_frame_last_sp_offset"] = -2

	// Statics.
	heaps, low, high, version, interp := f.alloc(8), f.alloc(8), f.alloc(8), f.alloc(8), f.alloc(8)
	static("CodeCache", "_heaps", "GrowableArray<CodeHeap*>*", heaps)
	static("CodeCache", "_low_bound", "address", low)
	static("CodeCache", "_high_bound", "address", high)
	static("Abstract_VM_Version", "_vm_major_version", "int", version)
	static("AbstractInterpreter", "_code", "StubQueue*", interp)
	f.u32(version, uint32(jdk))
	field("StubQueue", "_stub_buffer", "address", 8)
	field("StubQueue", "_buffer_limit", "int", 20)

	field("GrowableArrayBase", "_len", "int", 0)
	field("GrowableArray<int>", "_data", "int*", 8)
	field("VirtualSpace", "_low", "char*", 16)
	field("VirtualSpace", "_high", "char*", 24)
	field("CodeHeap", "_memory", "VirtualSpace", 8)
	field("CodeHeap", "_segmap", "VirtualSpace", 120)
	field("CodeHeap", "_log2_segment_size", "int", 256)
	field("HeapBlock", "_header", "HeapBlock::Header", 0)
	if jdk25 {
		field("HeapBlock::Header", "_length", "uint32_t", 0)
		field("HeapBlock::Header", "_used", "bool", 4)
	} else {
		field("HeapBlock::Header", "_length", "size_t", 0)
		field("HeapBlock::Header", "_used", "bool", 8)
	}

	// Code blobs and nmethods, each build's way.
	if jdk25 {
		for name, off := range map[string]uint64{"_size": 24, "_relocation_size": 28, "_code_offset": 36, "_data_offset": 40,
			"_frame_size": 44, "_mutable_data_size": 48} {
			field("CodeBlob", name, "int", off)
		}
		field("CodeBlob", "_name", "const char*", 8)
		field("CodeBlob", "_mutable_data", "address", 16)
		field("CodeBlob", "_header_size", "u2", 52)
		field("CodeBlob", "_frame_complete_offset", "int16_t", 54)
		field("CodeBlob", "_kind", "CodeBlobKind", 56)
		vs.IntConstants["CodeBlobKind::Nmethod"] = 1
		field("nmethod", "_method", "Method*", 80)
		field("nmethod", "_immutable_data", "address", 96)
		for name, off := range map[string]uint64{"_entry_bci": 156, "_immutable_data_size": 160, "_scopes_pcs_offset": 196,
			"_scopes_data_offset": 200, "_compile_id": 212} {
			field("nmethod", name, "int", off)
		}
		field("nmethod", "_comp_level", "CompLevel", 216)
	} else {
		for name, off := range map[string]uint64{"_size": 12, "_header_size": 16, "_frame_complete_offset": 20,
			"_data_offset": 24, "_frame_size": 28} {
			field("CodeBlob", name, "int", off)
		}
		field("CodeBlob", "_code_begin", "address", 32)
		field("CodeBlob", "_name", "const char*", 96)
		field("CompiledMethod", "_method", "Method*", 112)
		field("CompiledMethod", "_scopes_data_begin", "address", 120)
		for name, off := range map[string]uint64{"_entry_bci": 192, "_metadata_offset": 260, "_scopes_pcs_offset": 268,
			"_dependencies_offset": 272, "_compile_id": 304, "_comp_level": 308} {
			field("nmethod", name, "int", off)
		}
	}
	field("PcDesc", "_pc_offset", "int", 0)
	field("PcDesc", "_scope_decode_offset", "int", 4)

	// Methods.
	field("Method", "_constMethod", "ConstMethod*", 8)
	field("ConstMethod", "_constants", "ConstantPool*", 8)
	if jdk25 {
		field("ConstMethod", "_flags._flags", "u4", 28)
		vs.IntConstants["ConstMethodFlags::_misc_has_linenumber_table"] = 1
		for name, off := range map[string]uint64{"_code_size": 34, "_name_index": 36, "_signature_index": 38, "_method_idnum": 40} {
			field("ConstMethod", name, "u2", off)
		}
	} else {
		field("ConstMethod", "_flags", "u2", 28)
		vs.IntConstants["ConstMethod::_has_linenumber_table"] = 1
		for name, off := range map[string]uint64{"_code_size": 32, "_name_index": 34, "_signature_index": 36, "_method_idnum": 38} {
			field("ConstMethod", name, "u2", off)
		}
	}
	field("ConstantPool", "_pool_holder", "InstanceKlass*", 24)
	field("ConstantPool", "_source_file_name_index", "u2", 54)
	field("ConstantPool", "_length", "int", 60)
	field("Klass", "_name", "Symbol*", 24)
	field("InstanceKlass", "_methods", "Array<Method*>*", 400)
	field("Array<Method*>", "_data", "", 8)
	field("Array<int>", "_length", "int", 0)
	field("Symbol", "_length", "u2", 4)
	field("Symbol", "_body", "", 6)

	// The class, its pool and its methods.
	x := byte(0)
	if jdk >= 20 {
		x = 1
	}
	f.holder = f.alloc(472)
	f.u64(f.holder+24, f.symbol("pkg/Outer"))
	cp := f.alloc(fakeCPSize + 6*8)
	f.u64(cp+24, f.holder)
	f.u32(cp+60, 6)
	f.u16(cp+54, 5)
	f.outerName = f.symbol("outer")
	for i, s := range []uint64{0, f.outerName, f.symbol("(J)J"), f.symbol("leaf"), f.symbol("()V"), f.symbol("Outer.java")} {
		f.u64(cp+fakeCPSize+uint64(i)*8, s)
	}
	method := func(name, sig uint16, idnum uint16, lines []LinePair) (uint64, uint64) {
		m := f.alloc(fakeMethodSize)
		table := encodeLines(lines, x)
		cm := f.alloc(int(cmSize) + fakeCodeSize + len(table))
		f.u64(m+8, cm)
		f.u64(cm+8, cp)
		f.u16(cm+28, 1) // has a line number table
		fs := vs.Fields["ConstMethod"]
		f.u16(cm+fs["_code_size"].Offset, fakeCodeSize)
		f.u16(cm+fs["_name_index"].Offset, name)
		f.u16(cm+fs["_signature_index"].Offset, sig)
		f.u16(cm+fs["_method_idnum"].Offset, idnum)
		f.bytes(cm+cmSize+fakeCodeSize, table)
		return m, cm
	}
	f.outer, f.outerCM = method(1, 2, 0, []LinePair{{0, 10}, {5, 11}, {12, 12}})
	f.leaf, _ = method(3, 4, 1, []LinePair{{0, 40}, {3, 41}})
	arr := f.alloc(8 + 16)
	f.u32(arr, 2)
	f.u64(arr+8, f.leaf)
	f.u64(arr+16, f.outer)
	f.u64(f.holder+400, arr)

	// The code heap: an nmethod in its first block, a stub in its second, the rest free.
	const segs = 64
	f.heapLow = f.alloc(segs << fakeSegLog2)
	segmap := f.alloc(segs)
	for i := range uint64(segs) {
		f.mem[segmap-f.base+i] = 0xFF
	}
	heap := f.alloc(344)
	f.u64(heap+8+16, f.heapLow)
	f.u64(heap+8+24, f.heapLow+segs<<fakeSegLog2)
	f.u64(heap+120+16, segmap)
	f.u64(heap+120+24, segmap+segs)
	f.u32(heap+256, fakeSegLog2)
	ga := f.alloc(24)
	f.u32(ga, 1)
	harr := f.alloc(8)
	f.u64(harr, heap)
	f.u64(ga+8, harr)
	f.u64(heaps, ga)
	f.u64(low, f.heapLow)
	f.u64(high, f.heapLow+segs<<fakeSegLog2)

	block := func(seg, n uint64) uint64 {
		addr := f.heapLow + seg<<fakeSegLog2
		f.u64(addr, n) // the length's low bytes, whichever its size
		f.mem[addr-f.base+vs.Fields["HeapBlock::Header"]["_used"].Offset] = 1
		for i := range n {
			f.mem[segmap-f.base+seg+i] = byte(i)
		}
		return addr + heapBlock
	}
	blob := func(addr uint64, name string, size, codeOff, dataOff uint64, kind byte) {
		fs := vs.Fields["CodeBlob"]
		f.u64(addr+fs["_name"].Offset, f.cstring(name))
		f.u32(addr+fs["_size"].Offset, uint32(size))
		f.u32(addr+fs["_data_offset"].Offset, uint32(dataOff))
		if jdk25 {
			f.u32(addr+fs["_code_offset"].Offset, uint32(codeOff))
			f.mem[addr-f.base+fs["_kind"].Offset] = kind
		} else {
			f.u64(addr+fs["_code_begin"].Offset, addr+codeOff)
		}
	}
	// The nmethod: code from 384 to 768; its debug info after, or (JDK 25) apart.
	const nmSize = 1536
	f.nm = block(0, nmSize>>fakeSegLog2+1)
	name := "nmethod"
	blob(f.nm, name, nmSize, 384, 768, 1)
	f.codeBegin = f.nm + 384
	nmf := func(n string) uint64 {
		if fl, ok := vs.Fields["nmethod"][n]; ok {
			return f.nm + fl.Offset
		}
		return f.nm + vs.Fields["CompiledMethod"][n].Offset
	}
	f.u64(nmf("_method"), f.outer)
	f.u32(nmf("_compile_id"), 42)
	f.u32(nmf("_comp_level"), 4)
	f.u32(nmf("_entry_bci"), 0xFFFFFFFF)
	// Scopes: leaf at bci 3 inlined into outer at bci 5 (a call at pc offset 100); outer
	// alone at bci 12 (pc offset 200). Metadata: [outer, leaf], indexes 1 and 2.
	outerData, _ := encodeScopes([]Scope{{MethodIndex: 1, BCI: 12}}, x)
	both, bothOff := encodeScopes([]Scope{{MethodIndex: 2, BCI: 3}, {MethodIndex: 1, BCI: 5}}, x)
	scopes := append(both, outerData[1:]...)
	ownOff := len(both)
	pcs := make([]byte, 48)
	for i, pd := range [][2]int32{{-1, 0}, {100, int32(bothOff)}, {200, int32(ownOff)}} {
		binary.LittleEndian.PutUint32(pcs[i*16:], uint32(pd[0]))
		binary.LittleEndian.PutUint32(pcs[i*16+4:], uint32(pd[1]))
	}
	meta := make([]byte, 16)
	binary.LittleEndian.PutUint64(meta, f.outer)
	binary.LittleEndian.PutUint64(meta[8:], f.leaf)
	if jdk25 {
		imm := f.alloc(len(pcs) + len(scopes))
		f.bytes(imm, pcs)
		f.bytes(imm+uint64(len(pcs)), scopes)
		f.u64(nmf("_immutable_data"), imm)
		f.u32(nmf("_immutable_data_size"), uint32(len(pcs)+len(scopes)))
		f.u32(nmf("_scopes_pcs_offset"), 0)
		f.u32(nmf("_scopes_data_offset"), uint32(len(pcs)))
		const reloc = 24
		mut := f.alloc(reloc + len(meta))
		f.bytes(mut+reloc, meta)
		fs := vs.Fields["CodeBlob"]
		f.u64(f.nm+fs["_mutable_data"].Offset, mut)
		f.u32(f.nm+fs["_relocation_size"].Offset, reloc)
		f.u32(f.nm+fs["_mutable_data_size"].Offset, uint32(reloc+len(meta)))
	} else {
		at := uint64(768)
		f.u32(nmf("_metadata_offset"), uint32(at))
		f.bytes(f.nm+at, meta)
		at += uint64(len(meta))
		f.u64(nmf("_scopes_data_begin"), f.nm+at)
		f.bytes(f.nm+at, scopes)
		at += uint64(len(scopes))
		f.u32(nmf("_scopes_pcs_offset"), uint32(at))
		f.bytes(f.nm+at, pcs)
		f.u32(nmf("_dependencies_offset"), uint32(at)+uint32(len(pcs)))
	}
	f.callPC, f.ownPC = f.codeBegin+100, f.codeBegin+150

	f.stub = block(nmSize>>fakeSegLog2+1, 4)
	blob(f.stub, "Interpreter", 4<<fakeSegLog2-heapBlock, 64, 400, 2)
	iq := f.alloc(48)
	f.u64(iq+8, f.stub+64)
	f.u32(iq+20, 336)
	f.u64(interp, iq)
	return f
}

func (f *fakeJVM) process(t testing.TB) *Process {
	l, err := NewLayout(f.vs)
	if err != nil {
		t.Fatal(err)
	}
	p := &Process{m: f.fakeMem, VM: f.vs, Layout: l, Version: f.jdk}
	if f.jdk >= 20 {
		p.x = 1
	}
	return p
}

func frameNames(frames []Frame) string {
	var s []string
	for _, fr := range frames {
		s = append(s, fmt.Sprintf("%s%s:%d@%d", fr.Function, fr.Signature, fr.Line, fr.BCI))
	}
	return strings.Join(s, " < ")
}

func TestFakeNaming(t *testing.T) {
	for _, jdk := range []int{17, 25} {
		t.Run(fmt.Sprint(jdk), func(t *testing.T) {
			f := newFakeJVM(jdk)
			p := f.process(t)
			n := NewNamer(p, NamerConfig{})
			check := func(pc uint64, want string) {
				t.Helper()
				frames, err := n.Compiled(pc)
				if got := frameNames(frames); err != nil || got != want {
					t.Errorf("pc %#x: %s, %v; want %s", pc, got, err, want)
				}
			}
			check(f.callPC, "pkg.Outer.leaf()V:41@3 < pkg.Outer.outer(J)J:11@5")
			check(f.ownPC, "pkg.Outer.outer(J)J:12@12")
			check(f.stub+100, "[jit] Interpreter:-1@-1")
			if frames, err := n.Compiled(f.codeBegin + 300); err == nil {
				t.Errorf("pc past the last PcDesc: %s", frameNames(frames))
			}
			if frames, err := n.Compiled(f.heapLow + 40<<fakeSegLog2); err == nil || frameNames(frames) != "[jit] unknown:-1@-1" {
				t.Errorf("free code heap: %s, %v", frameNames(frames), err)
			}
			if fr, err := n.Interpreted(f.outer, f.outerCM+p.Layout.ConstMethodSize+6); err != nil || fr.Line != 11 || fr.BCI != 6 {
				t.Errorf("interpreted: %+v, %v", fr, err)
			}
			s := n.Stats()
			if s.Compiled != 2 || s.Stubs != 1 || s.Unnamed != 2 || s.Interpreted != 1 || s.Stale != 0 {
				t.Errorf("counts %+v", s)
			}

			nmf := func(name string) uint64 {
				if fl, ok := f.vs.Fields["nmethod"][name]; ok {
					return f.nm + fl.Offset
				}
				return f.nm + f.vs.Fields["CompiledMethod"][name].Offset
			}
			// Compiled again at the same address (another compile id): its debug info
			// is read again.
			f.u32(nmf("_compile_id"), 43)
			check(f.ownPC, "pkg.Outer.outer(J)J:12@12")
			// Now an nmethod of another method, whose scopes (still the old ones) say
			// outer: refused rather than named outer.
			f.u64(nmf("_method"), f.leaf)
			frames, err := n.Compiled(f.ownPC)
			if err == nil || frameNames(frames) != "[jit] nmethod:-1@-1" {
				t.Errorf("nmethod of another method whose scopes name outer: %s, %v", frameNames(frames), err)
			}
			if s := n.Stats(); s.Stale != 2 {
				t.Errorf("stale %d, want 2: %+v", s.Stale, s)
			}

			// A method whose ConstMethod changed is read again: renamed here.
			f.u64(nmf("_method"), f.outer)
			f.u32(nmf("_compile_id"), 42)
			f.bytes(f.outerName+6, []byte("OUTER"))
			fs := f.vs.Fields["ConstMethod"]
			f.u16(f.outerCM+fs["_method_idnum"].Offset, 7)
			check(f.ownPC, "pkg.Outer.OUTER(J)J:12@12")

			// A Method* that is not among its class's methods is refused.
			arr, _ := readU64(f.fakeMem, f.holder+400)
			f.u64(arr+16, 0x1234)
			n2 := NewNamer(p, NamerConfig{})
			if fr, err := n2.Interpreted(f.outer, 0); !errors.Is(err, errNotAMethod) || fr.Method != 0 {
				t.Errorf("method outside its class: %+v, %v", fr, err)
			}
		})
	}
}

// TestCacheBound: the cache never holds more than its bound, and names alike.
func TestCacheBound(t *testing.T) {
	f := newFakeJVM(25)
	p := f.process(t)
	full := NewNamer(p, NamerConfig{})
	full.Compiled(f.callPC)
	need := full.Stats().Bytes
	for _, max := range []int{1, need / 2, need - 1, need} {
		n := NewNamer(p, NamerConfig{MaxBytes: max})
		for range 3 {
			frames, err := n.Compiled(f.callPC)
			if err != nil || len(frames) != 2 {
				t.Errorf("max %d: %s, %v", max, frameNames(frames), err)
			}
			if s := n.Stats(); s.Bytes > max {
				t.Errorf("max %d: holds %d bytes", max, s.Bytes)
			}
		}
	}
}

// TestNamerConcurrent names from several goroutines at once through a cache too small
// for everything: the names stay right and the bound holds (run with -race).
func TestNamerConcurrent(t *testing.T) {
	f := newFakeJVM(25)
	p := f.process(t)
	n := NewNamer(p, NamerConfig{MaxBytes: 600})
	done := make(chan error)
	for g := range 4 {
		go func() {
			for i := range 200 {
				var err error
				switch (g + i) % 3 {
				case 0:
					frames, e := n.Compiled(f.callPC)
					if e == nil && frameNames(frames) != "pkg.Outer.leaf()V:41@3 < pkg.Outer.outer(J)J:11@5" {
						e = fmt.Errorf("call pc: %s", frameNames(frames))
					}
					err = e
				case 1:
					frames, e := n.Compiled(f.ownPC)
					if e == nil && frameNames(frames) != "pkg.Outer.outer(J)J:12@12" {
						e = fmt.Errorf("own pc: %s", frameNames(frames))
					}
					err = e
				default:
					fr, e := n.InterpretedBCI(f.leaf, 3)
					if e == nil && fr.Line != 41 {
						e = fmt.Errorf("leaf: %+v", fr)
					}
					err = e
				}
				if err != nil {
					done <- err
					return
				}
				if s := n.Stats(); s.Bytes > 600 {
					done <- fmt.Errorf("cache holds %d bytes", s.Bytes)
					return
				}
			}
			done <- nil
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	t.Logf("%+v", n.Stats())
}
