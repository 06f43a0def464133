package trace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testprog"
	"github.com/sonde-profiler/sonde/tracectx"
)

// fakeProc lays out the /proc files the collector reads for one process.
func fakeProc(t *testing.T, root string, pid int, comm, exe, maps string) {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "maps"), []byte(maps), 0o644)
	os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::/user.slice\n"), 0o644)
	os.Remove(filepath.Join(dir, "exe"))
	if err := os.Symlink(exe, filepath.Join(dir, "exe")); err != nil {
		t.Fatal(err)
	}
	// The process's root is the host's: its paths open the test's files.
	os.Remove(filepath.Join(dir, "root"))
	if err := os.Symlink("/", filepath.Join(dir, "root")); err != nil {
		t.Fatal(err)
	}
}

const helloC = `#include <stdio.h>
__attribute__((noinline)) int work(int n){int s=0;for(int i=0;i<n;i++)s+=i*i;return s;}
int main(int argc,char**argv){printf("%d\n",work(argc*1000));return 0;}
`

// helloProc builds helloC and fakes a proc file system whose process 7, named comm,
// maps its code at 0x1000; it returns the file system's root and the program's identity.
func helloProc(t *testing.T, comm string) (string, objfile.Key) {
	t.Helper()
	bin := testprog.BuildC(t, helloC, "-O1")
	var st syscall.Stat_t
	syscall.Stat(bin, &st)
	procfs := filepath.Join(t.TempDir(), "proc")
	fakeProc(t, procfs, 7, comm, bin, fmt.Sprintf("1000-2000 r-xp 00000000 %02x:%02x %d %s\n", unixMajor(st.Dev), unixMinor(st.Dev), st.Ino, bin))
	return procfs, objfile.Key{Dev: st.Dev, Inode: st.Ino}
}

// newAggregator starts a process tracker with pcfg and an aggregator over it with cfg.
func newAggregator(t testing.TB, pcfg ProcessConfig, cfg Config, start time.Time) (*Aggregator, *Processes) {
	t.Helper()
	procs := NewProcesses(pcfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { procs.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	a, err := NewAggregator(cfg, procs, start)
	if err != nil {
		t.Fatal(err)
	}
	return a, procs
}

func TestAggregatorResolves(t *testing.T) {
	dir := t.TempDir()
	bin := testprog.BuildC(t, helloC, "-O1", "-Wl,--build-id=sha1")
	var st syscall.Stat_t
	if err := syscall.Stat(bin, &st); err != nil {
		t.Fatal(err)
	}
	procfs := filepath.Join(dir, "proc")
	maps := fmt.Sprintf("400000-401000 r-xp 00001000 %02x:%02x %d %s\n7fff0000-7fff2000 r-xp 00000000 00:00 0 [vdso]\n",
		unixMajor(st.Dev), unixMinor(st.Dev), st.Ino, bin)
	fakeProc(t, procfs, 42, "hello", bin, maps)

	kernel := &Mapping{Start: KernelStart, End: ^uint64(0), Path: KernelPath}
	start := time.Unix(1000, 0)
	var fileErrs []string
	c, procs := newAggregator(t, ProcessConfig{ProcFS: procfs, OnFileError: func(p string, err error) { fileErrs = append(fileErrs, p) }},
		Config{Period: time.Second / 19, Kernel: kernel, KeepTimestamps: true}, start)

	leafA := []uint64{0x400100, 0x400200}
	leafB := []uint64{0x400300, 0x400200}
	at := start.Add(time.Second)
	c.Add(RawSample{PID: 42, TID: 42, Comm: "hello", Time: at, User: leafA})
	c.Add(RawSample{PID: 42, TID: 42, Comm: "hello", Time: at, User: leafA})
	c.Add(RawSample{PID: 42, TID: 43, Comm: "worker", Time: at, User: leafA})
	c.Add(RawSample{PID: 42, TID: 42, Comm: "hello", Time: at, User: leafB, Kernel: []uint64{0xffffffff81000010}})
	c.Add(RawSample{PID: 42, TID: 42, Comm: "hello", Time: at, User: []uint64{0x7fff0010, 0x12345}})

	p := c.Flush(start.Add(2 * time.Second))
	if len(fileErrs) != 0 {
		t.Fatalf("file errors: %v", fileErrs)
	}
	if p.TotalCount() != 5 || len(p.Samples) != 4 {
		t.Fatalf("got %d samples in %d aggregates, want 5 in 4", p.TotalCount(), len(p.Samples))
	}
	if !p.Start.Equal(start) || !p.End.Equal(start.Add(2*time.Second)) || p.Period != time.Second/19 {
		t.Errorf("interval %v..%v period %v", p.Start, p.End, p.Period)
	}
	// 0x400100, 0x400200, 0x400300, kernel, vdso, unmapped: each location once.
	if len(p.Locations) != 6 {
		t.Errorf("got %d distinct locations, want 6", len(p.Locations))
	}
	var sawPair, sawKernel, sawUnmapped bool
	for _, s := range p.Samples {
		if s.Process.Name != "hello" || s.Process.ExePath != bin || s.Process.PID != 42 {
			t.Errorf("process %+v", s.Process)
		}
		if s.TID == 42 && s.Count == 2 {
			sawPair = true
			if len(s.Timestamps) != 2 {
				t.Errorf("kept %d timestamps for 2 samples", len(s.Timestamps))
			}
			loc := s.Locations[0]
			off, ok := loc.FileOffset()
			if !ok || off != 0x1100 {
				t.Errorf("file offset of 0x400100 = %#x, %v; want 0x1100", off, ok)
			}
			if f := loc.Mapping.File; f == nil || len(f.GNUBuildID) != 40 || f.Key.Inode != st.Ino {
				t.Errorf("mapped file %+v", f)
			}
			if loc.Kind != FrameNative {
				t.Errorf("kind %v", loc.Kind)
			}
		}
		if s.TID == 43 && s.ThreadName != "worker" {
			t.Errorf("thread name %q", s.ThreadName)
		}
		if len(s.Locations) == 3 {
			sawKernel = s.Locations[0].Kind == FrameKernel && s.Locations[0].Mapping == kernel
		}
		for _, l := range s.Locations {
			if l.Address == 0x12345 {
				sawUnmapped = l.Mapping == nil
			}
			if l.Address == 0x7fff0010 && (l.Mapping == nil || l.Mapping.File != nil || l.Mapping.Path != "[vdso]") {
				t.Errorf("vdso frame mapping %+v", l.Mapping)
			}
		}
	}
	if !sawPair || !sawKernel || !sawUnmapped {
		t.Errorf("pair %v kernel-first %v unmapped %v", sawPair, sawKernel, sawUnmapped)
	}
	st2 := c.Stats()
	if st2.Samples != 5 || st2.UnresolvedFrames != 1 {
		t.Errorf("stats %+v", st2)
	}
	// The first reading at first sight, one re-read for the unmapped address, then the rate
	// limit: at most two however many samples miss.
	if n := procs.Stats().MapsReads; n < 1 || n > 2 {
		t.Errorf("maps read %d times, want 1 or 2 (re-reads are rate-limited)", n)
	}
	if next := c.Flush(start.Add(3 * time.Second)); len(next.Samples) != 0 || !next.Start.Equal(start.Add(2*time.Second)) {
		t.Errorf("second flush carried %d samples from %v", len(next.Samples), next.Start)
	}
}

// helloMaps builds helloC and returns it with a maps line that maps a page of it at start.
func helloMaps(t *testing.T) (bin string, line func(start uint64) string) {
	t.Helper()
	bin = testprog.BuildC(t, helloC, "-O1")
	var st syscall.Stat_t
	syscall.Stat(bin, &st)
	return bin, func(start uint64) string {
		return fmt.Sprintf("%x-%x r-xp 00000000 %02x:%02x %d %s\n", start, start+0x1000, unixMajor(st.Dev), unixMinor(st.Dev), st.Ino, bin)
	}
}

func TestAggregatorExecAndExit(t *testing.T) {
	dir := t.TempDir()
	bin, line := helloMaps(t)
	procfs := filepath.Join(dir, "proc")
	fakeProc(t, procfs, 7, "before", bin, line(0x1000))
	now := time.Now()
	c, procs := newAggregator(t, ProcessConfig{ProcFS: procfs}, Config{}, now)
	c.Add(RawSample{PID: 7, TID: 7, ExecID: 1, Comm: "before", Time: now, User: []uint64{0x1010}})
	procs.Settle(context.Background())

	// exec: new image at another address; the old sample keeps its old mapping.
	fakeProc(t, procfs, 7, "after", bin, line(0x9000))
	procs.Exec(7, 2)
	procs.Settle(context.Background())
	c.Add(RawSample{PID: 7, TID: 7, ExecID: 2, Comm: "after", Time: now, User: []uint64{0x9010}})
	c.Add(RawSample{PID: 7, TID: 7, ExecID: 2, Comm: "after", Time: now, User: []uint64{0x1010}})
	procs.Exit(7)
	os.RemoveAll(filepath.Join(procfs, "7"))
	// A sample behind the exit event still resolves against the exited process's mappings.
	c.Add(RawSample{PID: 7, TID: 7, ExecID: 2, Comm: "after", Time: now, User: []uint64{0x9020}})

	p := c.Flush(now.Add(time.Second))
	resolved := map[uint64]string{}
	for _, s := range p.Samples {
		for _, l := range s.Locations {
			name := "unmapped"
			if l.Mapping != nil {
				name = s.Process.Name
			}
			resolved[l.Address] = name
		}
	}
	if resolved[0x9010] != "after" || resolved[0x9020] != "after" {
		t.Errorf("after exec: %v", resolved)
	}
	if len(p.Samples) != 4 {
		t.Errorf("got %d aggregates, want 4 (the pre-exec 0x1010 differs from the post-exec one)", len(p.Samples))
	}
	if st := procs.Stats(); st.Processes != 0 {
		t.Errorf("exited process still tracked after flush: %+v", st)
	}
	// Its stacks' chunks go with it, whatever room the cache has: no sample can name
	// them again. Their locations follow at the next flush.
	if st := c.Stats(); st.Chunks != 0 || st.ChunksForgotten == 0 {
		t.Errorf("after the exited process was forgotten: %d chunks cached, %d forgotten", st.Chunks, st.ChunksForgotten)
	}
	c.Flush(now.Add(2 * time.Second))
	if st := c.Stats(); st.Locations != 0 {
		t.Errorf("%d locations outlive the exited process's chunks", st.Locations)
	}
}

// A process gone before its maps could be read still has its leaf resolved, to a file
// another process's reading identified, through the mapping the kernel named.
func TestAggregatorKernelMappings(t *testing.T) {
	procfs, key := helloProc(t, "first")
	now := time.Now()
	c, procs := newAggregator(t, ProcessConfig{ProcFS: procfs}, Config{}, now)
	c.Add(RawSample{PID: 7, TID: 7, Comm: "first", Time: now, User: []uint64{0x1010}})
	procs.Settle(context.Background())

	// Process 8 has no /proc entry: it exited before any reading.
	c.Add(RawSample{PID: 8, TID: 8, Comm: "gone", Time: now, User: []uint64{0x9010, 0x12345},
		Mappings: []SampledMapping{{Start: 0x9000, End: 0xa000, File: key}, {Start: 0x20000, End: 0x21000, File: objfile.Key{Dev: 1, Inode: 99}}}})
	c.Add(RawSample{PID: 8, TID: 8, Comm: "gone", Time: now, User: []uint64{0x9020}})
	p := c.Flush(now.Add(time.Second))
	var leaves, unresolved int
	for _, s := range p.Samples {
		if s.Process.PID != 8 {
			continue
		}
		for i, l := range s.Locations {
			switch {
			case i == 0 && l.Mapping != nil && l.Mapping.File != nil && l.Mapping.File.Key == key:
				leaves++
				if off, ok := l.FileOffset(); !ok || off != l.Address-0x9000 {
					t.Errorf("file offset of %#x: %#x, %v", l.Address, off, ok)
				}
			case l.Mapping == nil:
				unresolved++
			}
		}
	}
	if leaves != 2 || unresolved != 1 {
		t.Errorf("%d leaves resolved through the kernel's mapping (want 2), %d frames unresolved (want 1: 0x12345)", leaves, unresolved)
	}
	if st := procs.Stats(); st.KernelMappings != 1 || st.KernelMappingsUnknown != 1 {
		t.Errorf("kernel mappings kept %d (want 1), of unknown files %d (want 1)", st.KernelMappings, st.KernelMappingsUnknown)
	}
}

func unixMajor(dev uint64) uint64 { return (dev>>8)&0xfff | (dev>>32)&^0xfff }
func unixMinor(dev uint64) uint64 { return dev&0xff | (dev>>12)&^0xff }

func TestAggregatorIntervalClock(t *testing.T) {
	start := time.Now() // carries a monotonic reading
	c, _ := newAggregator(t, ProcessConfig{ProcFS: t.TempDir()}, Config{KeepTimestamps: true}, start)
	p1 := c.Flush(start.Add(time.Second))
	late := RawSample{PID: 1, TID: 1, Time: p1.End.Add(-time.Millisecond), User: []uint64{1}}
	c.Add(late)
	p2 := c.Flush(p1.End.Add(time.Second))
	if p1.End != p2.Start {
		t.Errorf("intervals do not abut: %v then %v", p1.End, p2.Start)
	}
	if got := p2.End.Sub(p2.Start); got != time.Duration(p2.End.UnixNano()-p2.Start.UnixNano()) {
		t.Errorf("duration %v disagrees with the wall-clock difference", got)
	}
	if ts := p2.Samples[0].Timestamps[0]; ts.Before(p2.Start) || !ts.Before(p2.End) {
		t.Errorf("late sample's time %v outside its interval [%v, %v)", ts, p2.Start, p2.End)
	}

	// A sample counted while a flush waits for /proc can be later than the end the flush
	// was asked for: its interval stretches to hold it and the next starts there.
	asked := p2.End.Add(time.Second)
	c.Add(RawSample{PID: 1, TID: 1, Time: asked.Add(7 * time.Millisecond), User: []uint64{1}})
	c.Add(RawSample{PID: 1, TID: 1, Time: asked, User: []uint64{2}})
	p3 := c.Flush(asked)
	if !p3.End.After(asked) {
		t.Errorf("interval ends at %v, before its latest sample at %v", p3.End, asked.Add(7*time.Millisecond))
	}
	for _, smp := range p3.Samples {
		for _, ts := range smp.Timestamps {
			if ts.Before(p3.Start) || !ts.Before(p3.End) {
				t.Errorf("sample's time %v outside its interval [%v, %v)", ts, p3.Start, p3.End)
			}
		}
	}
	p4 := c.Flush(asked.Add(time.Second))
	if p4.Start != p3.End {
		t.Errorf("intervals do not abut: %v then %v", p3.End, p4.Start)
	}
}

// A live process no sample showed stays tracked for IdleFor, its mappings read once,
// and is forgotten after; with no IdleFor, or near MaxProcesses, at the flush after the
// interval it was last sampled in.
func TestIdleProcessesKeptForIdleFor(t *testing.T) {
	procfs, _ := helloProc(t, "rare")
	for _, tc := range []struct {
		idleFor time.Duration
		max     int
	}{{0, 0}, {30 * time.Second, 0}, {30 * time.Second, 1}} {
		idleFor := tc.idleFor
		if tc.max > 0 {
			idleFor = 0 // as good as none: the one process is the bound's three quarters
		}
		now := time.Now()
		c, procs := newAggregator(t, ProcessConfig{ProcFS: procfs, IdleFor: tc.idleFor, MaxProcesses: tc.max}, Config{}, now)
		tracked := func() int { return procs.Stats().Processes }
		sample := func() {
			c.Add(RawSample{PID: 7, TID: 7, ExecID: 1, Comm: "rare", Time: now, User: []uint64{0x1010}})
			procs.Settle(context.Background())
		}
		// Sampled in the first interval, then every 25 s: the flushes come every 5 s.
		sample()
		var forgottenAt time.Duration
		for at := 5 * time.Second; at <= 90*time.Second; at += 5 * time.Second {
			now = now.Add(5 * time.Second)
			c.Flush(now)
			if tracked() == 0 && forgottenAt == 0 {
				forgottenAt = at
			}
			if at == 25*time.Second || at == 50*time.Second {
				sample()
			}
		}
		reads := procs.Stats().MapsReads
		switch idleFor {
		case 0:
			if forgottenAt != 10*time.Second || reads != 3 {
				t.Errorf("IdleFor %v, MaxProcesses %d: forgotten %v after the start, %d reads of its mappings; want at 10 s, 3 reads (one a sample)",
					tc.idleFor, tc.max, forgottenAt, reads)
			}
		default:
			// Last sampled in the interval from 50 s: kept through the one from 80 s.
			if forgottenAt != 90*time.Second || reads != 1 {
				t.Errorf("IdleFor %v: forgotten %v after the start, %d reads of its mappings; want at 90 s, 1 read", idleFor, forgottenAt, reads)
			}
		}
	}
}

// contextsSeen records what a ContextObserver hears.
type contextsSeen struct {
	mu   sync.Mutex
	gone []uint32
}

func (c *contextsSeen) TraceContext(uint32, uint64, tracectx.Kernel) {}
func (c *contextsSeen) TraceContextGone(pid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gone = append(c.gone, pid)
}

// Only a process whose trace context the kernel was told of is told gone: under an exec
// storm most processes never publish one, and each delete of nothing is a system call.
func TestContextGoneOnlyWherePublished(t *testing.T) {
	bin, line := helloMaps(t)
	procfs := filepath.Join(t.TempDir(), "proc")
	maps := line(0x1000)
	fakeProc(t, procfs, 7, "plain", bin, maps)
	fakeProc(t, procfs, 8, "traced", bin, maps)
	seen := &contextsSeen{}
	now := time.Now()
	c, procs := newAggregator(t, ProcessConfig{ProcFS: procfs, Contexts: seen}, Config{}, now)
	c.Add(RawSample{PID: 7, TID: 7, ExecID: 1, Time: now, User: []uint64{0x1010}})
	c.Add(RawSample{PID: 8, TID: 8, ExecID: 1, Time: now, User: []uint64{0x1010}})
	procs.Settle(context.Background())
	procs.mu.Lock()
	procs.images[8].ctx.Store(&tracectx.State{Kernel: tracectx.Kernel{HasTLS: true}})
	procs.mu.Unlock()
	for _, pid := range []uint32{7, 8} {
		procs.Exit(pid)
		os.RemoveAll(filepath.Join(procfs, fmt.Sprint(pid)))
	}
	c.Flush(now.Add(time.Second))
	seen.mu.Lock()
	defer seen.mu.Unlock()
	if !slices.Equal(seen.gone, []uint32{8}) {
		t.Errorf("told gone: %v, want only the process that published a context", seen.gone)
	}
}
