package python

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/trace"
)

// fakeMemory is a process's memory made of objects the test lays out.
type fakeMemory struct {
	mu   sync.Mutex
	mem  map[uint64][]byte // object start -> bytes
	next uint64
}

func newFakeMemory() *fakeMemory { return &fakeMemory{mem: map[uint64][]byte{}, next: 0x10000} }

func (f *fakeMemory) ReadAt(p []byte, addr uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for start, b := range f.mem {
		if addr >= start && addr+uint64(len(p)) <= start+uint64(len(b)) {
			copy(p, b[addr-start:])
			return nil
		}
	}
	return errors.New("unmapped")
}

func (f *fakeMemory) put(addr uint64, b []byte) {
	f.mu.Lock()
	f.mem[addr] = b
	f.mu.Unlock()
}

func (f *fakeMemory) alloc(b []byte) uint64 {
	f.mu.Lock()
	addr := f.next
	f.next += uint64(len(b)+15) &^ 15
	f.mu.Unlock()
	f.put(addr, b)
	return addr
}

// fake types: where the interpreter's types are in the fake process.
const (
	fakeCodeType  = 0x1000
	fakeStrType   = 0x2000
	fakeBytesType = 0x3000
)

func fakeImage() *Image {
	l, _ := tableLayout(Version{3, 12, 1})
	return &Image{Version: Version{3, 12, 1}, Layout: l, codeType: fakeCodeType, strType: fakeStrType, byteType: fakeBytesType}
}

func (f *fakeMemory) str(img *Image, s string) uint64 {
	b := make([]byte, img.Layout.ASCIISize+len(s)+1)
	binary.LittleEndian.PutUint64(b[obType:], fakeStrType)
	binary.LittleEndian.PutUint64(b[unicodeLength:], uint64(len(s)))
	binary.LittleEndian.PutUint32(b[unicodeState:], 1<<2|1<<5|1<<6) // kind 1, compact, ascii
	copy(b[img.Layout.ASCIISize:], s)
	return f.alloc(b)
}

func (f *fakeMemory) bytesObj(data []byte) uint64 {
	b := make([]byte, bytesData+len(data)+1)
	binary.LittleEndian.PutUint64(b[obType:], fakeBytesType)
	binary.LittleEndian.PutUint64(b[bytesSize:], uint64(len(data)))
	copy(b[bytesData:], data)
	return f.alloc(b)
}

// code lays out a code object of 3.12 named name, whose lines start at first and go one
// per instruction.
func (f *fakeMemory) code(img *Image, name, file string, first int) []byte {
	l := img.Layout
	b := make([]byte, codeHeadSize)
	binary.LittleEndian.PutUint64(b[obType:], fakeCodeType)
	binary.LittleEndian.PutUint32(b[l.CodeFirstLine:], uint32(first))
	n := f.str(img, name)
	binary.LittleEndian.PutUint64(b[l.CodeName:], n)
	binary.LittleEndian.PutUint64(b[l.CodeQualname:], n)
	binary.LittleEndian.PutUint64(b[l.CodeFilename:], f.str(img, file))
	// Location table: one code unit at the first line (code 13, delta 0), then one
	// unit per line (code 13, delta +1 = svarint 2).
	table := []byte{0x80 | 13<<3, 0}
	for range 10 {
		table = append(table, 0x80|13<<3, 2)
	}
	binary.LittleEndian.PutUint64(b[l.CodeLineTable:], f.bytesObj(table))
	return b
}

type fakeImages struct {
	mu  sync.Mutex
	img map[uint32]*Image
}

func (f *fakeImages) Image(pid uint32) *Image {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.img[pid]
}

func loc(pid uint32, image, code uint64, offset uint32) *trace.Location {
	return &trace.Location{Kind: trace.FrameInterp, Address: code, Interp: &trace.InterpFrame{Type: FrameType, Runtime: Number, PID: pid, Image: image, Code: code, Offset: offset}}
}

// TestNamer names code objects read at first sight, and names them afresh once another
// code object took the address: the image is renewed.
func TestNamer(t *testing.T) {
	img := fakeImage()
	mem := newFakeMemory()
	const codeAddr = 0x900000
	mem.put(codeAddr, mem.code(img, "Worker.run", "/srv/app.py", 40))
	images := &fakeImages{img: map[uint32]*Image{7: img}}
	now := time.Unix(1000, 0)
	var renewed []uint64
	n := NewNamer(NamerConfig{
		Images:  images,
		Memory:  func(uint32) Memory { return mem },
		OnReuse: func(pid uint32, image uint64) { renewed = append(renewed, image) },
		now:     func() time.Time { return now },
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	settle := func() {
		testenv.WaitFor(t, "the namer to read what was queued", testenv.StartTimeout, func() (bool, string) {
			l := n.codes.Pending()
			return l == 0, fmt.Sprintf("%d codes queued", l)
		})
	}

	n.SeenCode(7, 1, codeAddr)
	settle()
	if st := n.Stats(); st.CodesRead != 1 {
		t.Fatalf("%d code objects read at first sight, want 1", st.CodesRead)
	}
	// The process is gone: the code object read early still names its frames.
	images.mu.Lock()
	delete(images.img, 7)
	images.mu.Unlock()
	lines, ok := n.Name(loc(7, 1, codeAddr, 6))
	if !ok || lines[0].Function != "Worker.run" || lines[0].File != "/srv/app.py" || lines[0].Line != 43 {
		t.Fatalf("named %+v %v, want Worker.run /srv/app.py:43", lines, ok)
	}
	images.mu.Lock()
	images.img[7] = img
	images.mu.Unlock()

	// Seen again soon: trusted. Seen after the recheck period with the same object: kept.
	n.SeenCode(7, 1, codeAddr)
	now = now.Add(time.Minute)
	n.SeenCode(7, 1, codeAddr)
	settle()
	if st := n.Stats(); st.Rechecks != 1 || st.Reused != 0 || len(renewed) != 0 {
		t.Fatalf("after a recheck of the same object: %+v, renewed %v", st, renewed)
	}

	// Another function at the same address: the image is renewed, and the new image's
	// locations get the new name.
	mem.put(codeAddr, mem.code(img, "handle", "/srv/other.py", 100))
	now = now.Add(time.Minute)
	n.SeenCode(7, 1, codeAddr)
	settle()
	if len(renewed) != 1 || renewed[0] != 1 || n.Stats().Reused != 1 {
		t.Fatalf("renewed %v, stats %+v; want image 1 renewed once", renewed, n.Stats())
	}
	lines, ok = n.Name(loc(7, 2, codeAddr, 0))
	if !ok || lines[0].Function != "handle" || lines[0].Line != 100 {
		t.Fatalf("named %+v, want handle:100", lines)
	}
}

// TestNamerHostile: what is not a code object, strings that are not strings, line tables
// that claim gigabytes, a process that is gone: unnamed and counted, never a panic.
func TestNamerHostile(t *testing.T) {
	img := fakeImage()
	mem := newFakeMemory()
	l := img.Layout
	good := mem.code(img, "f", "/f.py", 1)
	cases := map[string][]byte{}
	wrongType := append([]byte(nil), good...)
	binary.LittleEndian.PutUint64(wrongType[obType:], fakeStrType)
	cases["not a code object"] = wrongType
	badName := append([]byte(nil), good...)
	binary.LittleEndian.PutUint64(badName[l.CodeQualname:], mem.bytesObj([]byte("x")))
	cases["name not a str"] = badName
	hugeTable := append([]byte(nil), good...)
	hb := make([]byte, bytesData)
	binary.LittleEndian.PutUint64(hb[obType:], fakeBytesType)
	binary.LittleEndian.PutUint64(hb[bytesSize:], 1<<40)
	binary.LittleEndian.PutUint64(hugeTable[l.CodeLineTable:], mem.alloc(hb))
	cases["line table of a terabyte"] = hugeTable
	dangling := append([]byte(nil), good...)
	binary.LittleEndian.PutUint64(dangling[l.CodeFilename:], 0xdead0000)
	cases["file name unmapped"] = dangling
	longName := append([]byte(nil), good...)
	sb := make([]byte, l.ASCIISize+8)
	binary.LittleEndian.PutUint64(sb[obType:], fakeStrType)
	binary.LittleEndian.PutUint64(sb[unicodeLength:], 1<<62)
	binary.LittleEndian.PutUint32(sb[unicodeState:], 1<<2|1<<5|1<<6)
	binary.LittleEndian.PutUint64(longName[l.CodeQualname:], mem.alloc(sb))
	cases["name of 2^62 characters"] = longName
	kind3 := append([]byte(nil), good...)
	kb := append([]byte(nil), sb...)
	binary.LittleEndian.PutUint64(kb[unicodeLength:], 3)
	binary.LittleEndian.PutUint32(kb[unicodeState:], 3<<2|1<<5)
	binary.LittleEndian.PutUint64(kind3[l.CodeQualname:], mem.alloc(kb))
	cases["str of kind 3"] = kind3

	n := NewNamer(NamerConfig{Images: &fakeImages{img: map[uint32]*Image{1: img}}, Memory: func(uint32) Memory { return mem }})
	addr := uint64(0x800000)
	for name, obj := range cases {
		addr += 0x1000
		mem.put(addr, obj)
		if lines, ok := n.Name(loc(1, 1, addr, 0)); ok {
			t.Errorf("%s: named %+v", name, lines)
		}
	}
	if lines, ok := n.Name(loc(2, 1, 0x800000, 0)); ok {
		t.Errorf("a process no tracker knows: named %+v", lines)
	}
	st := n.Stats()
	if st.Unnamed != uint64(len(cases))+1 || st.UnnamedGone != 1 {
		t.Errorf("stats %+v: want %d unnamed, one of a gone process", st, len(cases)+1)
	}
}

// FuzzLines: no line table, however hostile, makes a decoder panic, loop for long or
// produce ranges out of order.
func FuzzLines(f *testing.F) {
	f.Add(9, []byte{6, 1, 8, 2, 0, 255})
	f.Add(10, []byte{6, 1, 8, 128, 4, 2})
	f.Add(11, []byte{0x80 | 14<<3, 0x41, 0x7f, 2, 3, 0x98, 0x02, 0xf8})
	f.Fuzz(func(t *testing.T, minor int, table []byte) {
		ranges := decodeLines(9+(minor&3+4)%5, table, 1)
		if len(ranges) > maxLineRanges+1 {
			t.Fatalf("%d ranges", len(ranges))
		}
		for i := 1; i < len(ranges); i++ {
			if ranges[i].start < ranges[i-1].end {
				t.Fatalf("ranges out of order: %+v", ranges[i-1:i+1])
			}
		}
		_ = lineAt(ranges, 12)
	})
}
