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

func TestInterpFrameEncoding(t *testing.T) {
	for _, c := range []struct {
		runtime uint8
		payload uint64
	}{{1, 0}, {1, 1<<InterpPayloadBits - 1}, {InterpRuntimeMax, 0x1234_5678}, {7, 0x3_ffff_0000_0001}} {
		v := EncodeInterpFrame(c.runtime, c.payload)
		rt, payload, ok := DecodeInterpFrame(v)
		if !ok || rt != c.runtime || payload != c.payload {
			t.Errorf("%d/%#x: encoded %#x, decoded %d/%#x %v", c.runtime, c.payload, v, rt, payload, ok)
		}
		if v >= KernelStart || v < 1<<47 {
			t.Errorf("%#x: a runtime's frame looks like an address", v)
		}
	}
	for _, addr := range []uint64{0x400000, 0x7fff_ffff_f000, KernelStart, 0xffffffff81000010} {
		if _, _, ok := DecodeInterpFrame(addr); ok {
			t.Errorf("address %#x taken for a runtime's frame", addr)
		}
	}
}

// fakeRuntime is a language runtime of the tests' own: its frames pack an 8-byte aligned
// code address (below 2^47) above a 14-bit offset.
type fakeRuntime struct {
	mu   sync.Mutex
	seen map[[3]uint64]int
}

const fakeNumber = 9

func (r *fakeRuntime) FrameType() string { return "fakelang" }

func (r *fakeRuntime) DecodeFrame(payload uint64) (uint64, uint32) {
	return payload >> 14 << 3, uint32(payload & 0x3fff)
}

func fakeFrame(code uint64, offset uint32) uint64 {
	return EncodeInterpFrame(fakeNumber, code>>3<<14|uint64(offset))
}

func (r *fakeRuntime) SeenCode(pid uint32, image, code uint64) {
	r.mu.Lock()
	r.seen[[3]uint64{uint64(pid), image, code}]++
	r.mu.Unlock()
}

// TestAggregatorRuntime: a runtime's frames become locations of their image and of the
// runtime's kind, one per code and offset as the runtime decodes them, interleaved with
// the native ones; the runtime hears of their code once per new stack; they never send the
// tracker reading /proc again; and a renewed image gets locations of its own. A runtime no
// one registered keeps its frames, under the generic kind.
func TestAggregatorRuntime(t *testing.T) {
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
	seen := &fakeRuntime{seen: map[[3]uint64]int{}}
	start := time.Unix(1000, 0)
	a, procs := newAggregator(t, ProcessConfig{ProcFS: procfs}, Config{Period: time.Second, Runtimes: Runtimes{fakeNumber: seen}}, start)

	const codeA, codeB = 0x7f00_0000_1000, 0x7f00_0000_2000
	inner, outer := fakeFrame(codeA, 10), fakeFrame(codeB, 4)
	unknown := EncodeInterpFrame(fakeNumber+1, 0x77)
	stack := []uint64{0x400100, inner, outer, unknown, 0x400200}
	at := start.Add(time.Second)
	for range 3 {
		a.Add(RawSample{PID: 42, TID: 42, Time: at, User: stack})
	}
	a.Add(RawSample{PID: 43, TID: 43, Time: at, User: stack})
	p := a.Flush(start.Add(2 * time.Second))
	if reads := procs.Stats().MapsReads; reads != 2 {
		t.Errorf("%d reads of /proc for two processes: the runtime's frames asked for more", reads)
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
	if got := fmt.Sprint(kinds(s42)); got != fmt.Sprint([]FrameKind{FrameNative, FrameInterp, FrameInterp, FrameInterp, FrameNative}) {
		t.Errorf("kinds %s", got)
	}
	l := s42.Locations[1]
	if l.Address != codeA || l.Interp == nil || l.Interp.Code != codeA || l.Interp.Offset != 10 || l.Interp.PID != 42 || l.Mapping != nil ||
		l.Interp.Runtime != fakeNumber || l.KindName() != "fakelang" {
		t.Errorf("inner location %+v %+v", l, l.Interp)
	}
	if u := s42.Locations[3]; u.Interp == nil || u.Interp.Runtime != fakeNumber+1 || u.KindName() != "interpreted" || u.Address != 0x77 {
		t.Errorf("frame of an unregistered runtime: %+v %+v", u, u.Interp)
	}
	if s43.Locations[1] == l {
		t.Error("two processes share a runtime's location: code addresses mean something in one image only")
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
