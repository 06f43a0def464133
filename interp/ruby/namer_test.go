package ruby

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/sonde-profiler/sonde/trace"
)

type fakeMemory map[uint64][]byte

func (m fakeMemory) ReadAt(p []byte, addr uint64) error {
	for start, b := range m {
		if addr >= start && addr+uint64(len(p)) <= start+uint64(len(b)) {
			copy(p, b[addr-start:])
			return nil
		}
	}
	return fmt.Errorf("read %d bytes at %#x: unmapped", len(p), addr)
}

// str lays out a String as 3.3 does: embedded, its length at 16.
func (m fakeMemory) str(addr uint64, s string) uint64 {
	b := make([]byte, 40+len(s))
	binary.LittleEndian.PutUint64(b, typeString)
	binary.LittleEndian.PutUint64(b[16:], uint64(len(s)))
	copy(b[24:], s)
	m[addr] = b
	return addr
}

// iseq lays out an instruction sequence as 3.3 does, with a line table of positions.
func (m fakeMemory) iseq(addr uint64, flags uint64, label, path uint64, first int, positions []uint32, lines []int32) uint64 {
	l := layouts[3]
	body, entries, pos := addr+0x1000, addr+0x2000, addr+0x3000
	h := make([]byte, 24)
	binary.LittleEndian.PutUint64(h, flags)
	binary.LittleEndian.PutUint64(h[l.IseqBody:], body)
	m[addr] = h
	b := make([]byte, l.BodyInsnsInfo+32)
	binary.LittleEndian.PutUint32(b[l.BodyIseqSize:], 100)
	binary.LittleEndian.PutUint64(b[l.BodyLocation:], path)
	binary.LittleEndian.PutUint64(b[l.BodyLocation+16:], label)
	binary.LittleEndian.PutUint64(b[l.BodyLocation+24:], uint64(first)<<1|1)
	binary.LittleEndian.PutUint64(b[l.BodyInsnsInfo:], entries)
	binary.LittleEndian.PutUint64(b[l.BodyInsnsInfo+8:], pos)
	binary.LittleEndian.PutUint32(b[l.BodyInsnsInfo+16:], uint32(len(lines)))
	m[body] = b
	e := make([]byte, 12*len(lines))
	for i, ln := range lines {
		binary.LittleEndian.PutUint32(e[i*12:], uint32(ln))
	}
	m[entries] = e
	p := make([]byte, 4*len(positions))
	for i, x := range positions {
		binary.LittleEndian.PutUint32(p[i*4:], x)
	}
	m[pos] = p
	return addr
}

type images map[uint32]*Image

func (i images) Image(pid uint32) *Image { return i[pid] }

// TestNamer names frames by label, file and the line of their pc, and what is not an
// instruction sequence, or names no string, as [ruby], counted.
func TestNamer(t *testing.T) {
	mem := fakeMemory{}
	const iseqFlags = typeImemo | imemoIseq<<imemoShift
	path := mem.str(0x100, "/srv/app/orchard.rb")
	pluck := mem.iseq(0x100000, iseqFlags, mem.str(0x200, "pluck"), path, 12, []uint32{0, 4, 9}, []int32{12, 13, 15})
	notIseq := mem.iseq(0x20000, typeString, mem.str(0x300, "x"), path, 1, []uint32{0}, []int32{1})
	badLabel := mem.iseq(0x30000, iseqFlags, 0xdead0000, path, 1, []uint32{0}, []int32{1})
	n := NewNamer(NamerConfig{Images: images{7: {Layout: layouts[3]}}, Memory: func(uint32) Memory { return mem }})
	for pos, want := range map[uint32]int64{1: 12, 5: 13, 10: 15, 0: 12} {
		lines, ok := n.Name(&trace.Location{Interp: &trace.InterpFrame{PID: 7, Image: 1, Code: pluck, Offset: pos}})
		if !ok || len(lines) != 1 || lines[0].Function != "pluck" || lines[0].File != "/srv/app/orchard.rb" || lines[0].Line != want {
			t.Errorf("pc at %d: %+v %v, want pluck /srv/app/orchard.rb:%d", pos, lines, ok, want)
		}
	}
	for _, q := range []uint64{notIseq, badLabel} {
		lines, ok := n.Name(&trace.Location{Interp: &trace.InterpFrame{PID: 7, Image: 1, Code: q}})
		if !ok || len(lines) != 1 || lines[0].Function != unnamed {
			t.Errorf("%#x: %+v, want %s", q, lines, unnamed)
		}
	}
	if st := n.Stats(); st.Named != 4 || st.Unnamed != 2 || st.ReadErrors != 2 {
		t.Errorf("stats %+v", st)
	}
}

// u64s lays out words at addr.
func (m fakeMemory) u64s(addr uint64, words ...uint64) uint64 {
	b := make([]byte, 8*len(words))
	for i, w := range words {
		binary.LittleEndian.PutUint64(b[i*8:], w)
	}
	m[addr] = b
	return addr
}

// class lays out a 3.3 class: its flags, and its extension's attached object and path.
func (m fakeMemory) class(addr, flags, attached, path uint64) uint64 {
	l := layouts[3]
	b := make([]byte, l.ClassPath+8)
	binary.LittleEndian.PutUint64(b, flags)
	binary.LittleEndian.PutUint64(b[l.ClassAttached:], attached)
	binary.LittleEndian.PutUint64(b[l.ClassPath:], path)
	m[addr] = b
	return addr
}

// method lays out a method entry and its definition: an iseq method's sequence, or a C
// method's original ID.
func (m fakeMemory) method(addr, owner, typ, body, id uint64) uint64 {
	def := addr + 0x100
	m.u64s(addr, typeImemo|imemoMent<<imemoShift, owner, def, id, owner)
	m.u64s(def, typ, body, 0, 0, id)
	return addr | Method
}

// TestMethodNames names frames by their method entry as Ruby 3.4's backtraces do: a
// method with its class's path, "." for a singleton method, a module's method as included
// by its module, a C method by its ID's name from the VM's symbol table; a class that
// cannot be read, or Object (a script's top-level method), leaves the bare name; an svar
// holding the entry is followed.
func TestMethodNames(t *testing.T) {
	mem := fakeMemory{}
	l := layouts[3]
	const iseqFlags = typeImemo | imemoIseq<<imemoShift
	path := mem.str(0x100, "/srv/app/orchard.rb")
	orchard := mem.class(0x40000, typeClass, 0, mem.str(0x400, "Farm::Orchard"))
	meta := mem.class(0x41000, typeClass|l.FlSingleton, orchard, 0)
	module := mem.class(0x42000, typeModule, 0, mem.str(0x500, "Weighing"))
	iclass := mem.u64s(0x43000, typeIClass, module)
	array := mem.class(0x44000, typeClass, 0, mem.str(0x600, "Array"))
	object := mem.class(0x45000, typeClass, 0, mem.str(0x680, "Object"))
	pluck := mem.iseq(0x100000, iseqFlags, mem.str(0x200, "pluck"), path, 12, []uint32{0}, []int32{12})
	pick := mem.iseq(0x110000, iseqFlags, mem.str(0x280, "pick"), path, 20, []uint32{0}, []int32{20})
	weigh := mem.iseq(0x120000, iseqFlags, mem.str(0x300, "weigh"), path, 30, []uint32{0}, []int32{30})

	// The symbol table: last_id, then ids (an Array of 512-ID chunks, each ID's string
	// and symbol in turn). ID 0x1234's serial is 0x123: chunk 0, entry 0x123*2.
	const symbols, ids, chunk = 0x80000, 0x81000, 0x82000
	mem.u64s(symbols, 0x200, 0, ids)
	mem.u64s(ids, typeArray|flNoEmbed|1<<aryEmbedLenShift, 0, chunk, 0, 0) // embedded, one element
	elems := make([]uint64, 0x200*2)
	elems[0x123*2] = mem.str(0x700, "each")
	mem.u64s(chunk+0x1000, elems...)
	mem.u64s(chunk, typeArray, 0, uint64(len(elems)), 0, chunk+0x1000)

	n := NewNamer(NamerConfig{
		Images: images{7: {Layout: l, symbols: symbols, lastOpID: 0xa9}},
		Memory: func(uint32) Memory { return mem },
	})
	for code, want := range map[uint64]string{
		mem.method(0x20000, orchard, methodISeq, pluck, 0):  "Farm::Orchard#pluck",
		mem.method(0x21000, meta, methodISeq, pick, 0):      "Farm::Orchard.pick",
		mem.method(0x22000, iclass, methodISeq, weigh, 0):   "Weighing#weigh",
		mem.method(0x23000, array, methodCFunc, 0, 0x1234):  "Array#each",
		mem.method(0x24000, 0xbad000, methodISeq, pluck, 0): "pluck",
		mem.method(0x26000, object, methodISeq, pluck, 0):   "pluck", // a script's top-level method
		mem.method(0x25000, array, methodCFunc, 0, 0x9990):  unnamed, // past last_id
		pluck: "pluck", // a sequence, not a method entry
		// The svar that took the entry's place in ep[-2] when the method used $~.
		mem.u64s(0x28000, typeImemo|imemoSvar<<imemoShift, 0x20000, 0, 0, 0) | Method: "Farm::Orchard#pluck",
	} {
		lines, ok := n.Name(&trace.Location{Interp: &trace.InterpFrame{PID: 7, Image: 1, Code: code}})
		if !ok || len(lines) != 1 || lines[0].Function != want {
			t.Errorf("%#x: %+v, want %s", code, lines, want)
		}
	}
}
