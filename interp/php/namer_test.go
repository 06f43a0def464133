package php

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/trace"
)

// fakeMemory is a process's memory as a test lays it out: blocks by address.
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

// str lays out a zend_string at addr.
func (m fakeMemory) str(addr uint64, s string, flags byte) uint64 {
	b := make([]byte, 24+len(s)+1)
	b[4] = stringType | flags
	binary.LittleEndian.PutUint64(b[16:], uint64(len(s)))
	copy(b[24:], s)
	m[addr] = b
	return addr
}

// function lays out a zend_function at addr: its type, name, class and, for user code,
// its file and lines, as 8.2 does.
func (m fakeMemory) function(addr uint64, typ byte, name, scope, file uint64, first, last uint32) uint64 {
	l := layouts[2]
	b := make([]byte, l.OpArrayLineStart+8)
	b[l.FuncType] = typ
	binary.LittleEndian.PutUint64(b[l.FuncName:], name)
	binary.LittleEndian.PutUint64(b[l.FuncScope:], scope)
	binary.LittleEndian.PutUint64(b[l.OpArrayFilename:], file)
	binary.LittleEndian.PutUint32(b[l.OpArrayLineStart:], first)
	binary.LittleEndian.PutUint32(b[l.OpArrayLineStart+4:], last)
	m[addr] = b
	return addr
}

func (m fakeMemory) class(addr, name uint64) uint64 {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint64(b[8:], name)
	m[addr] = b
	return addr
}

type images map[uint32]*Image

func (i images) Image(pid uint32) *Image { return i[pid] }

// TestNamer names a method with its class, a function, a script's body, an internal
// function and eval'd code, with file and line; a line the frame did not record, or one
// outside its function (the JIT's stale opline), is the function's first.
func TestNamer(t *testing.T) {
	mem := fakeMemory{}
	file := mem.str(0x1000, "/srv/app/dock.php", 0x40)
	dock := mem.class(0x2000, mem.str(0x2100, "Dock", 0x40))
	unload := mem.function(0x3000, userFunction, mem.str(0x3100, "unload", 0x40), dock, file, 20, 27)
	harbor := mem.function(0x4000, userFunction, mem.str(0x4100, "harbor", 0), 0, file, 39, 48)
	main := mem.function(0x5000, userFunction, 0, 0, file, 1, 100)
	usort := mem.function(0x6000, internalFunction, mem.str(0x6100, "usort", 0x40), 0, 0, 0, 0)
	eval := mem.function(0x7000, evalCode, 0, 0, mem.str(0x7100, "/srv/app/dock.php(12) : eval()'d code", 0), 1, 1)
	n := NewNamer(NamerConfig{Images: images{7: {Layout: layouts[2]}}, Memory: func(uint32) Memory { return mem }})
	for _, c := range []struct {
		function uint64
		line     uint32
		want     trace.Line
	}{
		{unload, 23, trace.Line{Function: "Dock::unload", File: "/srv/app/dock.php", Line: 23}},
		{unload, 0, trace.Line{Function: "Dock::unload", File: "/srv/app/dock.php", Line: 20}},
		{unload, 8191, trace.Line{Function: "Dock::unload", File: "/srv/app/dock.php", Line: 20}},
		{harbor, 44, trace.Line{Function: "harbor", File: "/srv/app/dock.php", Line: 44}},
		{main, 92, trace.Line{Function: "{main}", File: "/srv/app/dock.php", Line: 92}},
		{usort, 0, trace.Line{Function: "usort"}},
		{eval, 1, trace.Line{Function: "{eval}", File: "/srv/app/dock.php(12) : eval()'d code", Line: 1}},
	} {
		lines, ok := n.Name(&trace.Location{Interp: &trace.InterpFrame{PID: 7, Image: 1, Code: c.function, Offset: c.line}})
		c.want.SystemName = c.want.Function
		if !ok || len(lines) != 1 || lines[0] != c.want {
			t.Errorf("function %#x line %d: %+v %v, want %+v", c.function, c.line, lines, ok, c.want)
		}
	}
	// Not a function, a string of another type, an unmapped name: [php], counted.
	bad := mem.function(0x8000, 9, 0, 0, 0, 0, 0)
	notString := mem.function(0x9000, userFunction, 0x9100, 0, file, 1, 2)
	mem[0x9100] = make([]byte, 32) // type 0: not a string
	unmapped := mem.function(0xa000, userFunction, 0xdead000, 0, file, 1, 2)
	for _, f := range []uint64{bad, notString, unmapped} {
		lines, ok := n.Name(&trace.Location{Interp: &trace.InterpFrame{PID: 7, Image: 1, Code: f}})
		if !ok || len(lines) != 1 || lines[0].Function != unnamed {
			t.Errorf("function %#x: %+v %v, want %s", f, lines, ok, unnamed)
		}
	}
	if st := n.Stats(); st.Named != 7 || st.Unnamed != 3 || st.ReadErrors != 3 {
		t.Errorf("stats %+v: want 7 named, 3 unnamed after 3 failed reads", st)
	}
}

// TestNamerReuse: a function read at first sight names its frames after its process is
// gone; its address given to another function (a request's op arrays freed, the next
// request's compiled there) is found when seen again after the recheck period, and the
// image is renewed so that old locations keep the old name and new ones get the new.
func TestNamerReuse(t *testing.T) {
	mem := fakeMemory{}
	file := mem.str(0x1000, "/srv/app/a.php", 0)
	mem.function(0x3000, userFunction, mem.str(0x3100, "first", 0), 0, file, 10, 20)
	now := time.Unix(1000, 0)
	var renewed []uint64
	imgs := &lockedImages{m: images{7: {Layout: layouts[2]}}}
	n := NewNamer(NamerConfig{Images: imgs, Memory: func(uint32) Memory { return mem },
		OnReuse: func(pid uint32, image uint64) { renewed = append(renewed, image) }, Now: func() time.Time { return now }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	settle := func() {
		testenv.WaitFor(t, "the namer to read what was queued", testenv.StartTimeout, func() (bool, string) {
			l := n.Pending()
			return l == 0, fmt.Sprintf("%d functions queued", l)
		})
	}
	n.SeenCode(7, 1, 0x3000)
	settle()
	imgs.set(7, nil)
	if lines, _ := n.Name(&trace.Location{Interp: &trace.InterpFrame{PID: 7, Image: 1, Code: 0x3000, Offset: 12}}); len(lines) != 1 || lines[0].Function != "first" || lines[0].Line != 12 {
		t.Fatalf("after the process is gone: %+v, want first:12", lines)
	}
	imgs.set(7, &Image{Layout: layouts[2]})
	mem.function(0x3000, userFunction, mem.str(0x3200, "second", 0), 0, file, 30, 40)
	now = now.Add(time.Minute)
	n.SeenCode(7, 1, 0x3000)
	settle()
	if len(renewed) != 1 || renewed[0] != 1 || n.Stats().Reused != 1 {
		t.Fatalf("renewed %v, stats %+v: want image 1 renewed once", renewed, n.Stats())
	}
	if lines, _ := n.Name(&trace.Location{Interp: &trace.InterpFrame{PID: 7, Image: 2, Code: 0x3000, Offset: 33}}); len(lines) != 1 || lines[0].Function != "second" || lines[0].Line != 33 {
		t.Fatalf("in the renewed image: %+v, want second:33", lines)
	}
}

type lockedImages struct {
	mu sync.Mutex
	m  images
}

func (l *lockedImages) Image(pid uint32) *Image {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[pid]
}

func (l *lockedImages) set(pid uint32, img *Image) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if img == nil {
		delete(l.m, pid)
	} else {
		l.m[pid] = img
	}
}
