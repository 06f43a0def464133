package jvm

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/symbolize"
	"github.com/sonde-profiler/sonde/trace"
)

// The Runtime is what cmd/agent drives a language runtime through.
var _ interface {
	trace.MappingObserver
	trace.Runtime
	symbolize.InterpNamer
	Run(ctx context.Context) error
	slog.LogValuer
} = (*Runtime)(nil)

type fakeKernel struct {
	mu      sync.Mutex
	set     map[uint32]KernelState
	sets    int
	deleted []uint32
	fail    error
}

func newFakeKernel() *fakeKernel { return &fakeKernel{set: map[uint32]KernelState{}} }

func (k *fakeKernel) Set(pid uint32, _ uint64, state any, _ []interp.Region) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.fail != nil {
		return k.fail
	}
	st := state.(*KernelState)
	k.set[pid] = *st
	k.sets++
	return nil
}

func (k *fakeKernel) Lookup(string, any, any) (bool, error) { return false, nil }
func (k *fakeKernel) Ends() (map[string]uint64, error)      { return nil, nil }

func (k *fakeKernel) Delete(pid uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.set, pid)
	k.deleted = append(k.deleted, pid)
	return nil
}

func (k *fakeKernel) state(pid uint32) (KernelState, bool, int, []uint32) {
	k.mu.Lock()
	defer k.mu.Unlock()
	st, ok := k.set[pid]
	return st, ok, k.sets, append([]uint32(nil), k.deleted...)
}

// fakeLib is a mapping of a libjvm.so that is never opened: the tests' find stands in
// for the Finder.
func fakeLib(inode uint64) []*trace.Mapping {
	path := fmt.Sprintf("/opt/jdk%d/lib/server/libjvm.so", inode)
	return []*trace.Mapping{
		{Start: 0x400000, End: 0x401000, Path: "/opt/jdk/bin/java", File: objfile.NewFile(objfile.Key{Dev: 1, Inode: 1}, "/opt/jdk/bin/java")},
		{Start: 0x7f0000000000, End: 0x7f0000100000, Path: path, File: objfile.NewFile(objfile.Key{Dev: 1, Inode: inode}, path)},
	}
}

// walkingKernel counts walks, as bpf.Sampler's adapter does.
type walkingKernel struct{ *fakeKernel }

func (walkingKernel) Ends() (map[string]uint64, error) {
	return map[string]uint64{"complete": 5, "no_blob": 2}, nil
}

// logText is what a summary logs of v.
func logText(v slog.LogValuer) string {
	var b strings.Builder
	slog.New(slog.NewTextHandler(&b, nil)).Info("", "jvm", v)
	return b.String()
}

type errorLog struct {
	mu   sync.Mutex
	errs []string
}

func (l *errorLog) add(path string, err error) {
	l.mu.Lock()
	l.errs = append(l.errs, path+": "+err.Error())
	l.mu.Unlock()
}

func (l *errorLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errs...)
}

// TestTrackerFake: a JVM read before it set up its code cache is read again at the next
// mappings, silently; once read, the kernel is told, and told again only when the state
// changes; a new exec, a process gone and one that no longer maps libjvm.so are deleted;
// a build sonde cannot read is told to OnError once and not read again.
func TestTrackerFake(t *testing.T) {
	for _, jdk := range []int{17, 25} {
		t.Run(fmt.Sprint(jdk), func(t *testing.T) {
			f := newFakeJVM(jdk)
			p := f.process(t)
			k := newFakeKernel()
			var log errorLog
			finds := 0
			tr := NewTracker(TrackerConfig{Kernel: k, OnError: log.add})
			tr.cfg.retryAfter = func(int) time.Duration { return time.Hour } // reads come from mappings only
			tr.cfg.find = func(pid uint32, m *trace.Mapping) (*Process, error) {
				finds++
				if m.File.Key.Inode == 666 {
					return nil, fmt.Errorf("layout: CodeBlob::_name: %w", ErrMissing)
				}
				return p, nil
			}
			cc := f.vs.Fields["CodeCache"]
			low, high := cc["_low_bound"].Address, cc["_high_bound"].Address
			saveLow, _ := readU64(f.fakeMem, low)
			saveHigh, _ := readU64(f.fakeMem, high)
			f.u64(low, 0)
			f.u64(high, 0)

			const pid = 100
			for range 3 {
				tr.ProcessMappings(pid, 7, fakeLib(2))
			}
			if _, ok, sets, _ := k.state(pid); ok || sets != 0 {
				t.Fatalf("told the kernel of a JVM without a code cache")
			}
			if s := tr.Stats(); s.NotReady != 3 || s.ReadErrors != 0 || s.GaveUp != 0 || s.Processes != 1 || s.Walked != 0 {
				t.Errorf("not ready: %+v", s)
			}
			if finds != 1 {
				t.Errorf("tables read %d times, want once per exec", finds)
			}
			f.u64(low, saveLow)
			f.u64(high, saveHigh)
			tr.ProcessMappings(pid, 7, fakeLib(2))
			st, ok, sets, _ := k.state(pid)
			want, err := p.KernelState()
			if err != nil {
				t.Fatal(err)
			}
			want.ExecID = 7
			if !ok || sets != 1 || !st.equal(want) {
				t.Fatalf("kernel has %+v (%v, %d sets), want %+v", st, ok, sets, want)
			}
			tr.ProcessMappings(pid, 7, fakeLib(2))
			if _, _, sets, _ := k.state(pid); sets != 1 {
				t.Errorf("told the kernel the same state again: %d sets", sets)
			}
			if s := tr.Stats(); s.Walked != 1 {
				t.Errorf("walked %d", s.Walked)
			}
			// The code heap committed more: told again.
			heapAddr := func() uint64 {
				ga, _ := readU64(f.fakeMem, cc["_heaps"].Address)
				arr, _ := readU64(f.fakeMem, ga+8)
				h, _ := readU64(f.fakeMem, arr)
				return h
			}()
			f.u64(heapAddr+8+24, f.heapLow+32<<fakeSegLog2)
			tr.ProcessMappings(pid, 7, fakeLib(2))
			if st, _, sets, _ := k.state(pid); sets != 2 || st.Heaps[0].High != f.heapLow+32<<fakeSegLog2 {
				t.Errorf("after the heap grew: %d sets, heaps %+v", sets, st.Heaps)
			}

			// Another exec: deleted, read anew, told with its exec id.
			tr.ProcessMappings(pid, 8, fakeLib(2))
			st, ok, _, deleted := k.state(pid)
			if len(deleted) != 1 || deleted[0] != pid || !ok || st.ExecID != 8 || finds != 2 {
				t.Errorf("new exec: deleted %v, state %v %+v, %d finds", deleted, ok, st, finds)
			}
			// No libjvm.so any more: deleted.
			tr.ProcessMappings(pid, 9, fakeLib(2)[:1])
			if _, ok, _, deleted := k.state(pid); ok || len(deleted) != 2 {
				t.Errorf("exec of another program: state %v, deleted %v", ok, deleted)
			}
			tr.ProcessMappings(pid, 10, fakeLib(2))
			tr.ProcessGone(pid)
			if _, ok, _, deleted := k.state(pid); ok || len(deleted) != 3 {
				t.Errorf("process gone: state %v, deleted %v", ok, deleted)
			}
			tr.ProcessGone(pid) // nothing owed
			if _, _, _, deleted := k.state(pid); len(deleted) != 3 {
				t.Errorf("deleted twice: %v", deleted)
			}
			if s := tr.Stats(); s.Processes != 0 || s.Walked != 0 {
				t.Errorf("after all are gone: %+v", s)
			}
			if errs := log.get(); len(errs) != 0 {
				t.Errorf("OnError heard %v", errs)
			}

			// A build sonde cannot read: one word, once, for all its processes, whose
			// tables are not read again.
			finds = 0
			for pid := uint32(200); pid < 203; pid++ {
				tr.ProcessMappings(pid, 1, fakeLib(666))
				tr.ProcessMappings(pid, 1, fakeLib(666))
			}
			if errs := log.get(); len(errs) != 1 || !strings.Contains(errs[0], "libjvm.so") || !strings.Contains(errs[0], "CodeBlob::_name") {
				t.Errorf("OnError heard %q", errs)
			}
			if finds != 1 {
				t.Errorf("an unreadable build's tables read %d times", finds)
			}
			if s := tr.Stats(); s.GaveUp != 1 || s.Processes != 0 {
				t.Errorf("unreadable build: %+v", s)
			}

			// A JVM that never initialises is given up on after maxAttempts, silently;
			// one whose reads keep failing otherwise is told to OnError once.
			f.u64(low, 0)
			f.u64(high, 0)
			for range maxAttempts + 5 {
				tr.ProcessMappings(300, 1, fakeLib(3))
			}
			if s := tr.Stats(); s.GaveUp != 2 || s.NotReady != 3+maxAttempts {
				t.Errorf("never ready: %+v", s)
			}
			f.u64(low, 0x2000)
			f.u64(high, 0x1000)
			for pid := uint32(400); pid < 402; pid++ {
				for range maxAttempts {
					tr.ProcessMappings(pid, 1, fakeLib(4))
				}
			}
			if errs := log.get(); len(errs) != 2 || !strings.Contains(errs[1], "code cache") {
				t.Errorf("OnError heard %q", errs)
			}
			if _, _, sets, _ := k.state(0); sets != 4 {
				t.Errorf("%d sets, want the 4 of the readable JVM's execs", sets)
			}
		})
	}
}

// TestTrackerRetries: a JVM read before it set up its code cache is read again without
// new mappings, the kernel told once it is ready; one that never is, given up on after
// maxAttempts; a process gone is not read again.
func TestTrackerRetries(t *testing.T) {
	f := newFakeJVM(25)
	p := f.process(t)
	k := newFakeKernel()
	tr := NewTracker(TrackerConfig{Kernel: k})
	tr.cfg.retryAfter = func(int) time.Duration { return time.Millisecond }
	tr.cfg.find = func(uint32, *trace.Mapping) (*Process, error) { return p, nil }
	cc := f.vs.Fields["CodeCache"]
	low, high := cc["_low_bound"].Address, cc["_high_bound"].Address
	saveLow, _ := readU64(f.fakeMem, low)
	saveHigh, _ := readU64(f.fakeMem, high)
	notReady := func() { f.u64(low, 0); f.u64(high, 0) }
	ready := func() { f.u64(low, saveLow); f.u64(high, saveHigh) }
	notReady()

	const pid = 100
	tr.ProcessMappings(pid, 7, fakeLib(2))
	testenv.WaitFor(t, "reads again", testenv.StartTimeout, func() (bool, string) {
		s := tr.Stats()
		return s.NotReady >= 3, fmt.Sprintf("%+v", s)
	})
	if _, ok, _, _ := k.state(pid); ok {
		t.Fatalf("told the kernel of a JVM without a code cache")
	}
	ready()
	testenv.WaitFor(t, "the kernel told of the JVM", testenv.StartTimeout, func() (bool, string) {
		st, ok, sets, _ := k.state(pid)
		return ok && sets == 1 && st.ExecID == 7, fmt.Sprintf("%+v, %v, %d sets; %+v", st, ok, sets, tr.Stats())
	})
	if s := tr.Stats(); s.GaveUp != 0 || s.Walked != 1 {
		t.Errorf("%+v", s)
	}

	notReady()
	tr.ProcessMappings(pid+1, 1, fakeLib(2))
	testenv.WaitFor(t, "given up", testenv.StartTimeout, func() (bool, string) {
		s := tr.Stats()
		return s.GaveUp == 1, fmt.Sprintf("%+v", s)
	})
	if s := tr.Stats(); s.NotReady < maxAttempts {
		t.Errorf("given up after %d reads, want %d", s.NotReady, maxAttempts)
	}

	// A retry that fires after its process went (its timer raced the exit) reads nothing.
	tr.cfg.retryAfter = func(int) time.Duration { return time.Hour }
	tr.ProcessMappings(pid+2, 1, fakeLib(2))
	tr.mu.Lock()
	gone := tr.procs[pid+2]
	tr.mu.Unlock()
	tr.ProcessGone(pid + 2)
	before := tr.Stats().NotReady
	ready()
	tr.retry(gone)
	if _, ok, _, _ := k.state(pid + 2); ok || tr.Stats().NotReady != before {
		t.Errorf("a process gone read again: %v, %+v", ok, tr.Stats())
	}
}

// TestTrackerBound: JVMs past MaxProcesses are counted, not tracked.
func TestTrackerBound(t *testing.T) {
	f := newFakeJVM(25)
	p := f.process(t)
	k := newFakeKernel()
	tr := NewTracker(TrackerConfig{Kernel: k, MaxProcesses: 2})
	tr.cfg.find = func(uint32, *trace.Mapping) (*Process, error) { return p, nil }
	for pid := uint32(1); pid <= 3; pid++ {
		tr.ProcessMappings(pid, 1, fakeLib(2))
	}
	if _, ok, sets, _ := k.state(3); ok || sets != 2 {
		t.Errorf("third JVM told: %v, %d sets", ok, sets)
	}
	if s := tr.Stats(); s.Processes != 2 || s.Untracked != 1 {
		t.Errorf("%+v", s)
	}
	tr.ProcessGone(1)
	tr.ProcessMappings(3, 1, fakeLib(2))
	if _, ok, _, _ := k.state(3); !ok {
		t.Error("third JVM not told once there was room")
	}
}

// fakeRuntime is a Runtime over a fake JVM as process pid, told of it at exec 1.
func fakeRuntime(t *testing.T, f *fakeJVM, cfg Config) (*Runtime, *Process) {
	t.Helper()
	p := f.process(t)
	if cfg.Kernel == nil {
		cfg.Kernel = newFakeKernel()
	}
	r := New(cfg)
	r.tracker.cfg.find = func(uint32, *trace.Mapping) (*Process, error) { return p, nil }
	r.ProcessMappings(fakePID, 1, fakeLib(2))
	if r.tracker.Process(fakePID) != p {
		t.Fatal("the fake JVM was not tracked")
	}
	return r, p
}

const fakePID = 100

// location is a JVM frame as the aggregator makes its location.
func location(r *Runtime, pid uint32, image, frame uint64) *trace.Location {
	id, payload, ok := trace.DecodeInterpFrame(frame)
	if !ok || id != Number {
		panic("not a JVM frame")
	}
	code, off := r.DecodeFrame(payload)
	return &trace.Location{Kind: trace.FrameInterp, Address: code, Interp: &trace.InterpFrame{Type: r.FrameType(),
		Runtime: id, PID: pid, Image: image, Code: code, Offset: off}}
}

func linesString(lines []trace.Line) string {
	var s []string
	for _, l := range lines {
		s = append(s, fmt.Sprintf("%s|%s|%s:%d", l.Function, l.SystemName, l.File, l.Line))
	}
	return strings.Join(s, " < ")
}

// runNames runs the Runtime's reader until the test ends.
func runNames(t *testing.T, r *Runtime) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// seeAll has the Runtime hear of frames as the aggregator does, and waits until its
// reader has read them all.
func seeAll(t *testing.T, r *Runtime, pid uint32, image uint64, frames ...uint64) {
	t.Helper()
	before := r.NamesStats().Read
	distinct := map[uint64]bool{}
	for _, fr := range frames {
		loc := location(r, pid, image, fr)
		distinct[loc.Interp.Code] = true
		r.SeenCode(pid, image, loc.Interp.Code)
	}
	testenv.WaitFor(t, "the frames' code to be read", testenv.StartTimeout, func() (bool, string) {
		s := r.NamesStats()
		return s.Read >= before+uint64(len(distinct)), fmt.Sprintf("%+v", s)
	})
}

// TestRuntimeFake names the kernel's frames of a fake JVM: a return address by its own
// PcDesc, a leaf by the next; a pc whose nmethod is another compilation than the frame's,
// a stub, a Method* that is none; interpreted frames at a bci, or at none.
func TestRuntimeFake(t *testing.T) {
	for _, jdk := range []int{17, 25} {
		t.Run(fmt.Sprint(jdk), func(t *testing.T) {
			f := newFakeJVM(jdk)
			var reused []uint64
			var mu sync.Mutex
			r, _ := fakeRuntime(t, f, Config{Kernel: walkingKernel{newFakeKernel()}, OnReuse: func(pid uint32, image uint64) {
				mu.Lock()
				reused = append(reused, image)
				mu.Unlock()
			}})
			runNames(t, r)
			const image = 5
			cases := []struct {
				frame uint64
				want  string
			}{
				// The call at offset 100 has its PcDesc: leaf inlined into outer.
				{EncodeCodeFrame(f.callPC, true, 42), "pkg.Outer.leaf|pkg.Outer.leaf()V|Outer.java:41 < pkg.Outer.outer|pkg.Outer.outer(J)J|Outer.java:11"},
				{EncodeCodeFrame(f.callPC, false, 42), "pkg.Outer.leaf|pkg.Outer.leaf()V|Outer.java:41 < pkg.Outer.outer|pkg.Outer.outer(J)J|Outer.java:11"},
				// Offset 150 has none: a leaf takes the next (outer alone, line 12); a
				// return address only its nmethod's method, without a line.
				{EncodeCodeFrame(f.ownPC, false, 42), "pkg.Outer.outer|pkg.Outer.outer(J)J|Outer.java:12"},
				{EncodeCodeFrame(f.ownPC, true, 42), "pkg.Outer.outer|pkg.Outer.outer(J)J|Outer.java:0"},
				// Compile 42+256 would match; 43 is another compilation's frame.
				{EncodeCodeFrame(f.callPC, true, 43), "[jit] nmethod|[jit] nmethod|:0"},
				{EncodeCodeFrame(f.stub+100, false, 42), "[jit] Interpreter|[jit] Interpreter|:0"},
				{EncodeCodeFrame(f.heapLow+40<<fakeSegLog2, false, 0), "[jit] unknown|[jit] unknown|:0"},
				{EncodeInterpretedFrame(f.outer, 6), "pkg.Outer.outer|pkg.Outer.outer(J)J|Outer.java:11"},
				{EncodeInterpretedFrame(f.outer, 12), "pkg.Outer.outer|pkg.Outer.outer(J)J|Outer.java:12"},
				{EncodeInterpretedFrame(f.outer, -1), "pkg.Outer.outer|pkg.Outer.outer(J)J|Outer.java:0"},
				{EncodeInterpretedFrame(f.outer, fakeCodeSize), "pkg.Outer.outer|pkg.Outer.outer(J)J|Outer.java:0"},
				{EncodeInterpretedFrame(f.leaf, 3), "pkg.Outer.leaf|pkg.Outer.leaf()V|Outer.java:41"},
				{EncodeInterpretedFrame(f.outer+8, 3), "[jit] interpreter|[jit] interpreter|:0"},
				{EncodeInterpretedFrame(f.outerCM, 3), "[jit] interpreter|[jit] interpreter|:0"},
			}
			var frames []uint64
			for _, c := range cases {
				frames = append(frames, c.frame)
			}
			seeAll(t, r, fakePID, image, frames...)
			read := r.NamesStats().Read
			for _, c := range cases {
				lines, ok := r.Name(location(r, fakePID, image, c.frame))
				if got := linesString(lines); !ok || got != c.want {
					t.Errorf("frame %#x: %s, %v; want %s", c.frame, got, ok, c.want)
				}
			}
			s := r.NamesStats()
			if s.Read != read {
				t.Errorf("Name read %d codes that SeenCode had read", s.Read-read)
			}
			if s.Named != 9 || s.Recompiled != 1 || s.Stubs != 1 || s.Unnamed != 3 {
				t.Errorf("names %+v", s)
			}
			ns := r.tracker.NamerStats()
			if ns.Recompiled != 1 || ns.Outermost != 1 {
				t.Errorf("namer %+v", ns)
			}
			summary := logText(r)
			for _, want := range []string{"jvm.jvms.walked=1", "jvm.names.named=9", "jvm.names.recompiled=1", "jvm.namer.outermost=1",
				"jvm.kernel_walks.complete=5", "jvm.kernel_walks.no_blob=2", "jvm.finder.attached=0"} {
				if !strings.Contains(summary, want) {
					t.Errorf("summary without %s: %s", want, summary)
				}
			}

			// Frames of an image before the exec's first are another exec's: not read
			// from this one.
			lines, _ := r.Name(location(r, fakePID, image-1, EncodeCodeFrame(f.callPC, true, 42)))
			if got := linesString(lines); got != "[jit] unknown|[jit] unknown|:0" {
				t.Errorf("an earlier image's frame: %s", got)
			}

			// The method renamed in place: a recheck finds other code and renews the
			// image; until then the name stays.
			r.names.cfg.now = func() time.Time { return time.Now().Add(time.Hour) }
			f.bytes(f.outerName+6, []byte("OUTER"))
			fs := f.vs.Fields["ConstMethod"]
			f.u16(f.outerCM+fs["_method_idnum"].Offset, 7)
			interp := EncodeInterpretedFrame(f.outer, 6)
			r.SeenCode(fakePID, image, location(r, fakePID, image, interp).Interp.Code)
			testenv.WaitFor(t, "the recheck", testenv.StartTimeout, func() (bool, string) {
				mu.Lock()
				defer mu.Unlock()
				return len(reused) == 1, fmt.Sprintf("reused %v, %+v", reused, r.NamesStats())
			})
			if reused[0] != image {
				t.Errorf("renewed %v", reused)
			}
			if lines, _ := r.Name(location(r, fakePID, image+1, interp)); !strings.HasPrefix(linesString(lines), "pkg.Outer.OUTER|") {
				t.Errorf("renamed: %s", linesString(lines))
			}
			// The nmethod's methods unchanged but for the name: rechecked alike.
			r.SeenCode(fakePID, image, location(r, fakePID, image, cases[2].frame).Interp.Code)
			testenv.WaitFor(t, "the nmethod's recheck", testenv.StartTimeout, func() (bool, string) {
				mu.Lock()
				defer mu.Unlock()
				return len(reused) == 2, fmt.Sprintf("reused %v, %+v", reused, r.NamesStats())
			})

			// The process gone: what was read stays named, what was not is not read.
			r.ProcessGone(fakePID)
			if lines, _ := r.Name(location(r, fakePID, image, cases[0].frame)); linesString(lines) != cases[0].want {
				t.Errorf("after the process: %s", linesString(lines))
			}
			if lines, _ := r.Name(location(r, fakePID, image, EncodeCodeFrame(f.callPC+1, false, 42))); linesString(lines) != "[jit] unknown|[jit] unknown|:0" {
				t.Errorf("unread after the process: %s", linesString(lines))
			}
			if s := r.tracker.NamerStats(); s.Bytes != 0 || r.shared.inUse() != 0 {
				t.Errorf("a gone process's Namer holds %d bytes, the shared bound %d", s.Bytes, r.shared.inUse())
			}
		})
	}
}

// TestRuntimeBytes: the processes' Namers share the Runtime's bound, and a code cached
// by name stays within its half.
func TestRuntimeBytes(t *testing.T) {
	f := newFakeJVM(25)
	full, _ := fakeRuntime(t, f, Config{})
	runNames(t, full)
	frames := []uint64{EncodeCodeFrame(f.callPC, true, 42), EncodeCodeFrame(f.ownPC, false, 42), EncodeInterpretedFrame(f.leaf, 3)}
	seeAll(t, full, fakePID, 1, frames...)
	need := full.shared.inUse()
	if need == 0 {
		t.Fatal("nothing cached")
	}
	for _, max := range []int{2, need, need * 2, need * 4} {
		r, _ := fakeRuntime(t, f, Config{MaxBytes: max})
		// A second JVM sharing the bound.
		p2 := f.process(t)
		r.tracker.cfg.find = func(uint32, *trace.Mapping) (*Process, error) { return p2, nil }
		r.ProcessMappings(fakePID+1, 1, fakeLib(2))
		runNames(t, r)
		for _, pid := range []uint32{fakePID, fakePID + 1} {
			seeAll(t, r, pid, uint64(pid), frames...)
			for _, fr := range frames {
				if lines, _ := r.Name(location(r, pid, uint64(pid), fr)); strings.HasPrefix(linesString(lines), "[jit]") {
					t.Errorf("max %d: %s", max, linesString(lines))
				}
			}
		}
		if used := r.shared.inUse(); used > max/2 {
			t.Errorf("max %d: Namers hold %d bytes", max, used)
		}
		if s := r.NamesStats(); s.CachedSize > max/2 {
			t.Errorf("max %d: names hold %d bytes", max, s.CachedSize)
		}
		t.Logf("max %d: namers %d bytes, names %+v", max, r.shared.inUse(), r.NamesStats())
	}
}

// TestFrameEncoding: frames round-trip through the kernel's encoding, a pc's identity
// keeps its return bit and compile tag and is never a Method*'s.
func TestFrameEncoding(t *testing.T) {
	for _, c := range []struct {
		pc  uint64
		ret bool
		tag uint8
	}{{0x7f12_3456_7890, false, 0}, {0x7f12_3456_7890, true, 0}, {0x7f12_3456_7890, true, 255}, {1<<47 - 1, false, 17}, {0, true, 1}} {
		v := EncodeCodeFrame(c.pc, c.ret, c.tag)
		rt, payload, ok := trace.DecodeInterpFrame(v)
		if !ok || rt != Number || payload>>kindShift != kindCode || payload>>56&1 != 0 {
			t.Fatalf("%+v: encoded %#x, runtime %d %v", c, v, rt, ok)
		}
		code, off := DecodeFrame(payload)
		pc, ret, tag, isCode := codeFrame(code)
		if !isCode || pc != c.pc || ret != c.ret || tag != c.tag || off != 0 {
			t.Errorf("%+v: decoded %#x+%d as %#x %v %d %v", c, code, off, pc, ret, tag, isCode)
		}
		if code < 1<<47 {
			t.Errorf("%+v: identity %#x could be a Method*", c, code)
		}
	}
	a, _ := DecodeFrame(EncodeCodeFrame(0x7f00_0000_1000, false, 1) & (1<<trace.InterpPayloadBits - 1))
	b, _ := DecodeFrame(EncodeCodeFrame(0x7f00_0000_1000, true, 1) & (1<<trace.InterpPayloadBits - 1))
	c, _ := DecodeFrame(EncodeCodeFrame(0x7f00_0000_1000, false, 2) & (1<<trace.InterpPayloadBits - 1))
	if a == b || a == c || b == c {
		t.Errorf("a pc's frames share an identity: %#x %#x %#x", a, b, c)
	}
	for _, c := range []struct {
		method uint64
		bci    int32
		want   uint32
	}{{0x7f12_3456_7890, 0, 0}, {0x8, 12, 12}, {1<<47 - 8, BCIUnknown - 1, BCIUnknown - 1},
		{0x7f00_0000_1000, BCIUnknown, BCIUnknown}, {0x7f00_0000_1000, 1 << 20, BCIUnknown}, {0x7f00_0000_1000, -1, BCIUnknown}} {
		v := EncodeInterpretedFrame(c.method, c.bci)
		rt, payload, ok := trace.DecodeInterpFrame(v)
		if !ok || rt != Number || payload>>kindShift != kindInterp {
			t.Fatalf("%+v: encoded %#x", c, v)
		}
		if code, off := DecodeFrame(payload); code != c.method || off != c.want {
			t.Errorf("%+v: decoded %#x+%d", c, code, off)
		}
		if _, _, _, isCode := codeFrame(c.method); isCode {
			t.Errorf("Method* %#x taken for a pc", c.method)
		}
	}
}
