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
	pluck := mem.iseq(0x10000, iseqFlags, mem.str(0x200, "pluck"), path, 12, []uint32{0, 4, 9}, []int32{12, 13, 15})
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
