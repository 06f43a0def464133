package debuginfod_test

import (
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/symbolize"
	"github.com/sonde-profiler/sonde/symbolize/debuginfod"
	"github.com/sonde-profiler/sonde/trace"
)

const program = `
#include <stdio.h>
__attribute__((noinline)) static int spin(int x) { for (int i = 0; i < 1000; i++) x = x * 3 + 1; return x; }
int main(int argc, char **argv) { printf("%d\n", spin(argc)); return 0; }
`

func runTool(t testing.TB, name string, args ...string) {
	t.Helper()
	p := testenv.RequireTool(t, name)
	if out, err := exec.Command(p, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// stripped builds program, puts its debug file in serveDir and returns the binary
// stripped of everything but its build ID, the address of spin and the build ID.
func stripped(t testing.TB, serveDir string) (bin string, spin uint64, buildID string) {
	t.Helper()
	dir := t.TempDir()
	src, full := filepath.Join(dir, "prog.c"), filepath.Join(dir, "prog.full")
	bin = filepath.Join(dir, "prog")
	if err := os.WriteFile(src, []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	runTool(t, "gcc", "-g", "-O1", "-fno-inline", "-Wl,--build-id", "-o", full, src)
	runTool(t, "objcopy", "--only-keep-debug", full, filepath.Join(serveDir, "prog.debug"))
	runTool(t, "strip", "-s", "-o", bin, full)
	f, err := elf.Open(full)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name == "spin" {
			spin = s.Value
		}
	}
	sf, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	if sf.Section(".symtab") != nil || sf.Section(".debug_info") != nil || spin == 0 {
		t.Fatalf("the stripped program keeps symbols or DWARF, or spin is not found")
	}
	buildID = objfile.GNUBuildID(sf)
	if buildID == "" {
		t.Fatal("strip -s dropped the build id")
	}
	return bin, spin, buildID
}

// location is a leaf frame at vaddr+1 in bin, mapped whole at a fixed base.
func location(t testing.TB, bin, buildID string, vaddr uint64) *trace.Location {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	const base = 0x7f00_0000_0000
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Vaddr <= vaddr && vaddr < p.Vaddr+p.Memsz {
			file := objfile.HostFile(objfile.Key{Dev: 1, Inode: 7}, bin)
			file.GNUBuildID = buildID
			m := &trace.Mapping{Start: base, End: base + uint64(fi.Size()), Path: bin, File: file}
			return &trace.Location{Kind: trace.FrameNative, Address: base + vaddr + 1 - p.Vaddr + p.Off, Mapping: m}
		}
	}
	t.Fatalf("%#x in no segment of %s", vaddr, bin)
	return nil
}

type client struct {
	*debuginfod.Client
	stop func()
}

func startClient(t testing.TB, cfg debuginfod.Config) client {
	t.Helper()
	c, err := debuginfod.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Error("Run did not return within 30s of its context's end")
			}
		})
	}
	t.Cleanup(stop)
	return client{c, stop}
}

// interval names a fresh location at spin, as each interval of the agent brings one.
func interval(t testing.TB, s *symbolize.Symbolizer, bin, id string, spin uint64) *trace.Location {
	t.Helper()
	loc := location(t, bin, id, spin)
	if errs := s.Symbolize(&trace.Profile{Locations: []*trace.Location{loc}}); len(errs) != 0 {
		t.Fatalf("symbolize: %v", errs)
	}
	return loc
}

func namedByDWARF(loc *trace.Location) bool {
	return loc.NameSource == symbolize.SourceDWARF && len(loc.Lines) == 1 && loc.Lines[0].Function == "spin" &&
		strings.HasSuffix(loc.Lines[0].File, "prog.c") && loc.Lines[0].Line > 0
}

// A stripped program's frames get function, file and line from a real elfutils
// debuginfod, in an interval after the first; after a restart, in the first interval,
// from the disk cache. The server killed mid-run costs a counted error, nothing else.
func TestElfutilsDebuginfod(t *testing.T) {
	serve := t.TempDir()
	bin, spin, id := stripped(t, serve)
	url, kill := testenv.Debuginfod(t, serve, id)
	cache := t.TempDir()
	var mu sync.Mutex
	var reported []error
	cfg := debuginfod.Config{URLs: []string{url}, CacheDir: cache, Timeout: 5 * time.Second,
		OnError: func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() }}
	c := startClient(t, cfg)
	s := symbolize.New(symbolize.Options{DebugDirs: []string{}, DebugFetcher: c})

	start := time.Now()
	first := interval(t, s, bin, id, spin)
	if first.NameSource == symbolize.SourceDWARF {
		t.Fatalf("named by DWARF before any fetch: %+v", first.Lines)
	}
	t.Logf("first interval: %+v from %s", first.Lines, first.NameSource)
	var loc *trace.Location
	intervals := 1
	deadline := time.Now().Add(2 * time.Minute)
	for loc = interval(t, s, bin, id, spin); !namedByDWARF(loc); loc = interval(t, s, bin, id, spin) {
		if time.Now().After(deadline) {
			t.Fatalf("not named from the server's debug file within 2 minutes: %+v from %s; client %+v", loc.Lines, loc.NameSource, c.Stats())
		}
		intervals++
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("named %s at %s:%d after %v, %d intervals", loc.Lines[0].Function, loc.Lines[0].File, loc.Lines[0].Line, time.Since(start).Round(time.Millisecond), intervals)
	if st := c.Stats(); st.Fetches != 1 || st.Downloads != 1 || st.Bytes == 0 || len(st.Errors) != 0 {
		t.Errorf("client stats %+v", st)
	}
	if st := s.Stats(); st.DebugFilesFetched != 1 {
		t.Errorf("symbolizer stats %+v", st)
	}

	// The server dies; a program it never had is asked of it: a network error,
	// counted and reported once, and the symbolizer goes on.
	kill()
	otherServe := t.TempDir()
	other, otherSpin, otherID := stripped(t, otherServe)
	if otherID == id {
		t.Fatal("two builds share a build id")
	}
	loc = interval(t, s, other, otherID, otherSpin)
	if loc.NameSource == symbolize.SourceDWARF {
		t.Errorf("named by DWARF with no server: %+v", loc.Lines)
	}
	deadline = time.Now().Add(time.Minute)
	for c.Stats().Errors[debuginfod.ErrKindNetwork] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no network error counted: %+v", c.Stats())
		}
		interval(t, s, other, otherID, otherSpin)
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	if len(reported) != 1 {
		t.Errorf("reported %v, want the one error", reported)
	}
	mu.Unlock()
	c.stop()

	// A restart: the cache names at the first interval without a request.
	c2 := startClient(t, cfg)
	s2 := symbolize.New(symbolize.Options{DebugDirs: []string{}, DebugFetcher: c2})
	if loc := interval(t, s2, bin, id, spin); !namedByDWARF(loc) {
		t.Errorf("first interval after a restart: %+v from %s, want spin from DWARF", loc.Lines, loc.NameSource)
	}
	if st := c2.Stats(); st.Fetches != 0 || st.Hits != 1 {
		t.Errorf("after a restart: %+v, want a hit and no fetch", st)
	}
	entries, _ := os.ReadDir(cache)
	if len(entries) != 1 || entries[0].Name() != id {
		t.Errorf("cache holds %v, want only %s", entries, id)
	}
}
