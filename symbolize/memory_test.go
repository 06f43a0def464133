package symbolize

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/trace"
)

// memoryUse is what one operation costs the heap: allocated in total (the churn that
// drives collections and the process's peak), the most it held at once, and what it
// left held.
type memoryUse struct {
	alloc, peak, live int64
	// peakAnon is the most the process's anonymous resident memory grew by: the
	// heap as the system sees it, and scratch memory kept off the heap (decompressed
	// DWARF sections).
	peakAnon int64
}

// anonResident reads the process's anonymous resident memory from statm: resident
// pages less those backed by files.
func anonResident() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0
	}
	resident, _ := strconv.ParseInt(f[1], 10, 64)
	shared, _ := strconv.ParseInt(f[2], 10, 64)
	return (resident - shared) * int64(os.Getpagesize())
}

// measureMemory runs op once and measures its heap use, and the growth of the
// process's anonymous memory, which off-heap scratch shows in. The collector runs at
// GOGC=10 meanwhile, so that the sampled heap follows what is reachable rather than
// the pacer; the sampler reads the runtime's object bytes every 100 µs, which a
// short-lived spike can slip between. op's result is kept alive until the heap it
// leaves has been measured.
func measureMemory(op func() any) memoryUse {
	runtime.GC()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	base := int64(sample[0].Value.Uint64())
	anonBase := anonResident()
	old := debug.SetGCPercent(10)
	var (
		wg             sync.WaitGroup
		stop           = make(chan struct{})
		peak, peakAnon int64
	)
	wg.Go(func() {
		s := []metrics.Sample{{Name: sample[0].Name}}
		for {
			metrics.Read(s)
			peak = max(peak, int64(s[0].Value.Uint64())-base)
			peakAnon = max(peakAnon, anonResident()-anonBase)
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	})
	kept := op()
	close(stop)
	wg.Wait()
	debug.SetGCPercent(old)
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(kept)
	return memoryUse{
		alloc:    int64(after.TotalAlloc - before.TotalAlloc),
		peak:     peak,
		live:     int64(after.HeapAlloc) - int64(before.HeapAlloc),
		peakAnon: peakAnon,
	}
}

func (m memoryUse) report(b *testing.B) {
	b.ReportMetric(float64(m.alloc)/(1<<20), "alloc-MB")
	b.ReportMetric(float64(m.peak)/(1<<20), "peak-MB")
	b.ReportMetric(float64(m.live)/(1<<20), "live-MB")
	b.ReportMetric(float64(m.peakAnon)/(1<<20), "peak-anon-MB")
}

// BenchmarkMemory measures the heap that naming costs, for the inputs that dominate
// a host's profile: the C library with its separate DWARF (every function, and a
// profile's worth of 200 addresses), a large Go binary, and the kernel's symbols.
// alloc-MB is what the operation allocated in total, peak-MB the most it held at
// once, live-MB what stays held with the file cached (the address cache is off, so
// that it is the file's tables and no names); peak-anon-MB is the most the process's
// anonymous memory grew, off-heap scratch included.
func BenchmarkMemory(b *testing.B) {
	symbolizeAll := func(b *testing.B, mode Mode, locs []*trace.Location) {
		p := &trace.Profile{Locations: locs}
		var m memoryUse
		for b.Loop() {
			reset(locs)
			m = measureMemory(func() any {
				s := New(Options{Mode: mode, AddressCacheSize: -1})
				if errs := s.Symbolize(p); len(errs) != 0 {
					b.Fatal(errs)
				}
				reset(locs) // the lines would count as the file's
				return s
			})
		}
		m.report(b)
	}
	b.Run("libc-full/all", func(b *testing.B) {
		symbolizeAll(b, ModeFull, libcLocations(b))
	})
	b.Run("libc-full/200", func(b *testing.B) {
		lib := "/usr/lib/x86_64-linux-gnu/libc.so.6"
		if _, err := os.Stat(lib); err != nil {
			b.Skipf("no %s", lib)
		}
		m := wholeFile(b, lib, objfile.Key{Dev: 1, Inode: 91})
		symbolizeAll(b, ModeFull, locationsAt(b, m, spreadText(b, lib, 200)))
	})
	b.Run("go-compile/2000", func(b *testing.B) {
		bin := goCompiler(b)
		m := wholeFile(b, bin, objfile.Key{Dev: 1, Inode: 92})
		m.File.IsGo = true
		symbolizeAll(b, ModeFull, locationsAt(b, m, spreadText(b, bin, 2000)))
	})
	b.Run("kallsyms", func(b *testing.B) {
		if _, err := LoadKallsyms(DefaultKallsymsPath); err != nil {
			b.Skipf("kallsyms: %v", err)
		}
		var m memoryUse
		n := 0
		for b.Loop() {
			m = measureMemory(func() any {
				ks, err := LoadKallsyms(DefaultKallsymsPath)
				if err != nil {
					b.Fatal(err)
				}
				n = ks.Len()
				return ks
			})
		}
		m.report(b)
		b.ReportMetric(float64(n), "symbols")
	})
}

// goCompiler is the Go toolchain's compiler, a large Go binary every Go install has.
func goCompiler(b testing.TB) string {
	b.Helper()
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		b.Skipf("go env GOROOT: %v", err)
	}
	bin := filepath.Join(strings.TrimSpace(string(out)), "pkg", "tool", runtime.GOOS+"_"+runtime.GOARCH, "compile")
	if _, err := os.Stat(bin); err != nil {
		b.Skipf("no Go compiler at %s", bin)
	}
	return bin
}

// BenchmarkLookupCost is the cost of naming one location from tables already read,
// the address cache off: what a location costs the first time a profile holds it.
// The locations are those of BenchmarkMemory, cycled through after a first pass that
// reads the files and, for DWARF read lazily, decodes their units, which all stay.
func BenchmarkLookupCost(b *testing.B) {
	cycle := func(b *testing.B, mode Mode, locs []*trace.Location) {
		// Every decoded unit fits: the cost measured is a lookup's, not a decode's.
		s := New(Options{Mode: mode, AddressCacheSize: -1, DWARFCacheBytes: 1 << 30})
		p := &trace.Profile{Locations: locs}
		if errs := s.Symbolize(p); len(errs) != 0 {
			b.Fatal(errs)
		}
		one := &trace.Profile{Locations: make([]*trace.Location, 1)}
		i := 0
		for b.Loop() {
			loc := locs[i]
			loc.Lines, loc.NameSource = nil, ""
			one.Locations[0] = loc
			s.Symbolize(one)
			i = (i + 1) % len(locs)
		}
		countNamed(b, locs)
	}
	b.Run("libc-full", func(b *testing.B) {
		cycle(b, ModeFull, libcLocations(b))
	})
	b.Run("libc-symtab", func(b *testing.B) {
		cycle(b, ModeSymtab, libcLocations(b))
	})
	b.Run("go-compile", func(b *testing.B) {
		bin := goCompiler(b)
		m := wholeFile(b, bin, objfile.Key{Dev: 1, Inode: 93})
		m.File.IsGo = true
		cycle(b, ModeFull, locationsAt(b, m, spreadText(b, bin, 2000)))
	})
	b.Run("kallsyms", func(b *testing.B) {
		ks, err := LoadKallsyms(DefaultKallsymsPath)
		if err != nil {
			b.Skipf("kallsyms: %v", err)
		}
		addrs := make([]uint64, 0, 4096)
		for i := 0; i < ks.Len() && len(addrs) < cap(addrs); i += max(1, ks.Len()/cap(addrs)) {
			addrs = append(addrs, ks.addr(i)+1)
		}
		i := 0
		for b.Loop() {
			if _, ok := ks.Lookup(addrs[i]); !ok {
				b.Fatalf("%#x: miss", addrs[i])
			}
			i = (i + 1) % len(addrs)
		}
	})
}

// A naming pass over many new addresses of one large file does not make all that its
// lookups read resident at once: a Go program's first pass, hundreds of addresses
// spread over its pclntab, held 8 MB of the Collector's before the pages were given back
// every few lookups.
func TestLookupsGiveBackPages(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "big")
	writeCold(t, bin, src)
	const n = 400
	s := New(Options{})
	var peak int64
	s.afterLookup = func() {
		peak = max(peak, testenv.Resident(t, func(_, _ uint64, path string) bool { return path == bin }))
	}
	m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 91})
	locs := locationsAt(t, m, spreadText(t, bin, n))
	s.Symbolize(&trace.Profile{Locations: locs})
	named := 0
	for _, l := range locs {
		if len(l.Lines) > 0 {
			named++
		}
	}
	if named < n*9/10 {
		t.Fatalf("%d of %d addresses named: the test does not exercise lookups", named, n)
	}
	// 16 lookups read a few dozen pages; all 400 of them, 3 MB of the pclntab.
	const bound = 1536 << 10
	if peak > bound {
		t.Errorf("lookups held %d KiB of the file resident at once; want at most %d", peak>>10, bound>>10)
	}
	t.Logf("peak resident %d KiB of a %d KiB file, %d addresses named", peak>>10, len(src)>>10, named)
}

// writeCold writes a file and drops it from the page cache, so that it is read from
// disk as a program on the host is: the pages of a file just written are dirty, and a
// fault maps a dirty large folio whole.
func writeCold(t *testing.T, path string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}
