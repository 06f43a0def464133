package trace

import (
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testprog"
)

func TestPythonFrameEncoding(t *testing.T) {
	for _, c := range []struct {
		code   uint64
		offset uint32
	}{{0x7f12_3456_7890, 0}, {0x10, 2}, {1<<47 - 16, 1<<20 - 2}, {0x5555_0000_0000, 1234}} {
		v := EncodePythonFrame(c.code, c.offset)
		code, off, ok := PythonFrame(v)
		if !ok || code != c.code || off != c.offset {
			t.Errorf("%#x+%d: encoded %#x, decoded %#x+%d %v", c.code, c.offset, v, code, off, ok)
		}
		if v >= KernelStart || v < 1<<47 {
			t.Errorf("%#x: a Python frame looks like an address", v)
		}
	}
	for _, addr := range []uint64{0x400000, 0x7fff_ffff_f000, KernelStart, 0xffffffff81000010} {
		if _, _, ok := PythonFrame(addr); ok {
			t.Errorf("address %#x taken for a Python frame", addr)
		}
	}
}

type seenCodes struct {
	mu   sync.Mutex
	seen map[[3]uint64]int
}

func (s *seenCodes) SeenCode(pid uint32, image, code uint64) {
	s.mu.Lock()
	s.seen[[3]uint64{uint64(pid), image, code}]++
	s.mu.Unlock()
}

// TestAggregatorPython: Python frames become cpython locations of their image, one per
// code object and offset, interleaved with the native ones; the observer hears of their
// code objects once per new stack; they never send the tracker reading /proc again; and a
// renewed image gets locations of its own.
func TestAggregatorPython(t *testing.T) {
	dir := t.TempDir()
	bin := testprog.BuildC(t, helloC, "-O1", "-Wl,--build-id=sha1")
	var st syscall.Stat_t
	if err := syscall.Stat(bin, &st); err != nil {
		t.Fatal(err)
	}
	procfs := filepath.Join(dir, "proc")
	maps := fmt.Sprintf("400000-401000 r-xp 00001000 %02x:%02x %d %s\n", unixMajor(st.Dev), unixMinor(st.Dev), st.Ino, bin)
	fakeProc(t, procfs, 42, "python", bin, maps)
	fakeProc(t, procfs, 43, "python", bin, maps)
	seen := &seenCodes{seen: map[[3]uint64]int{}}
	start := time.Unix(1000, 0)
	a, procs := newAggregator(t, ProcessConfig{ProcFS: procfs}, Config{Period: time.Second, Interp: seen}, start)

	const codeA, codeB = 0x7f00_0000_1000, 0x7f00_0000_2000
	inner, outer := EncodePythonFrame(codeA, 10), EncodePythonFrame(codeB, 4)
	stack := []uint64{0x400100, inner, outer, 0x400200}
	at := start.Add(time.Second)
	for range 3 {
		a.Add(RawSample{PID: 42, TID: 42, Time: at, User: stack})
	}
	a.Add(RawSample{PID: 43, TID: 43, Time: at, User: stack})
	p := a.Flush(start.Add(2 * time.Second))
	if reads := procs.Stats().MapsReads; reads != 2 {
		t.Errorf("%d reads of /proc for two processes: Python frames asked for more", reads)
	}
	byPID := map[uint32]*Sample{}
	for _, s := range p.Samples {
		byPID[s.Process.PID] = s
	}
	s42, s43 := byPID[42], byPID[43]
	if s42 == nil || s43 == nil || s42.Count != 3 {
		t.Fatalf("samples %+v", p.Samples)
	}
	kinds := func(s *Sample) []FrameKind {
		var k []FrameKind
		for _, l := range s.Locations {
			k = append(k, l.Kind)
		}
		return k
	}
	if got := fmt.Sprint(kinds(s42)); got != fmt.Sprint([]FrameKind{FrameNative, FramePython, FramePython, FrameNative}) {
		t.Errorf("kinds %s", got)
	}
	l := s42.Locations[1]
	if l.Address != codeA || l.Interp == nil || l.Interp.Code != codeA || l.Interp.Offset != 10 || l.Interp.PID != 42 || l.Mapping != nil {
		t.Errorf("inner location %+v %+v", l, l.Interp)
	}
	if s43.Locations[1] == l {
		t.Error("two processes share a Python location: code addresses mean something in one image only")
	}
	if n := seen.seen[[3]uint64{42, l.Interp.Image, codeA}]; n != 1 {
		t.Errorf("the observer heard of inner's code object %d times for three samples of one stack, want 1", n)
	}

	// Renewed: the same frames are new locations from now on.
	a.RenewImage(42, l.Interp.Image)
	a.Add(RawSample{PID: 42, TID: 42, Time: start.Add(3 * time.Second), User: stack})
	p = a.Flush(start.Add(4 * time.Second))
	if len(p.Samples) != 1 || p.Samples[0].Locations[1] == l || p.Samples[0].Locations[1].Interp.Image == l.Interp.Image {
		t.Errorf("after RenewImage, the old location was kept")
	}
	if a.Stats().ImagesRenewed != 1 {
		t.Errorf("renewals counted: %d", a.Stats().ImagesRenewed)
	}
}
