package symbolize

import (
	"debug/elf"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/trace"
)

// libcLocations returns a location at every function start+4 of the C library: all
// functions of the debug file's .symtab when libc6-dbg is installed, else the exported ones.
func libcLocations(b testing.TB) []*trace.Location {
	b.Helper()
	lib := "/usr/lib/x86_64-linux-gnu/libc.so.6"
	if _, err := os.Stat(lib); err != nil {
		testenv.Unavailable(b, "no %s", lib)
	}
	m := wholeFile(b, lib, objfile.Key{Dev: 1, Inode: 90})
	lists := [][]nmSym{nmSymbols(b, lib, "-D")}
	f, err := elf.Open(lib)
	if err != nil {
		b.Fatal(err)
	}
	id := objfile.GNUBuildID(f)
	f.Close()
	if debug := filepath.Join("/usr/lib/debug/.build-id", id[:2], id[2:]+".debug"); id != "" {
		if _, err := os.Stat(debug); err == nil {
			lists = append(lists, nmSymbols(b, debug))
		}
	}
	seen := map[uint64]bool{}
	var vaddrs []uint64
	for _, list := range lists {
		for _, s := range list {
			if (s.typ == 'T' || s.typ == 't' || s.typ == 'W' || s.typ == 'i') && !seen[s.addr] {
				seen[s.addr] = true
				vaddrs = append(vaddrs, s.addr+4)
			}
		}
	}
	return locationsAt(b, m, vaddrs)
}

func reset(locs []*trace.Location) {
	for _, l := range locs {
		l.Lines, l.NameSource = nil, ""
	}
}

func countNamed(b *testing.B, locs []*trace.Location) (n int) {
	for _, l := range locs {
		if len(l.Lines) > 0 {
			n++
		}
	}
	if n < len(locs)/2 {
		b.Fatalf("%d of %d locations named", n, len(locs))
	}
	return n
}

// BenchmarkLibc measures naming every function of libc: the first time, through a
// fresh Symbolizer that opens and parses the file (and libc6-dbg's DWARF in full
// mode); then from the address cache; then from the parsed tables with the address
// cache off. heap-MiB/file is what one cached libc holds, measured as the live heap
// it adds; est-MiB/file is the Symbolizer's own estimate (Stats.CachedFileBytes and
// CachedDWARFBytes). The DWARF cache is large enough for every unit of libc, which
// naming all its functions decodes.
func BenchmarkLibc(b *testing.B) {
	locs := libcLocations(b)
	p := &trace.Profile{Locations: locs}
	for _, mode := range []Mode{ModeFull, ModeSymtab} {
		b.Run(string(mode)+"/first", func(b *testing.B) {
			for b.Loop() {
				reset(locs)
				if errs := New(Options{Mode: mode}).Symbolize(p); len(errs) != 0 {
					b.Fatal(errs)
				}
			}
			countNamed(b, locs)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(locs)), "ns/frame")
			b.ReportMetric(float64(len(locs)), "frames")
		})
		b.Run(string(mode)+"/cached", func(b *testing.B) {
			s := New(Options{Mode: mode, AddressCacheSize: 2 * len(locs), DWARFCacheBytes: 1 << 30})
			s.Symbolize(p)
			b.ResetTimer()
			for b.Loop() {
				reset(locs)
				s.Symbolize(p)
			}
			countNamed(b, locs)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(locs)), "ns/frame")
		})
		b.Run(string(mode)+"/tables", func(b *testing.B) {
			s := New(Options{Mode: mode, AddressCacheSize: -1, DWARFCacheBytes: 1 << 30})
			s.Symbolize(p)
			b.ResetTimer()
			for b.Loop() {
				reset(locs)
				s.Symbolize(p)
			}
			countNamed(b, locs)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(locs)), "ns/frame")
		})
		b.Run(string(mode)+"/memory", func(b *testing.B) {
			var before, after runtime.MemStats
			var s *Symbolizer
			for b.Loop() {
				reset(locs)
				runtime.GC()
				runtime.ReadMemStats(&before)
				// No address cache: what stays is the parsed file.
				s = New(Options{Mode: mode, AddressCacheSize: -1, DWARFCacheBytes: 1 << 30})
				s.Symbolize(p)
				reset(locs) // the lines would otherwise count
				runtime.GC()
				runtime.ReadMemStats(&after)
			}
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "heap-MiB/file")
			st := s.Stats()
			b.ReportMetric(float64(st.CachedFileBytes+st.CachedDWARFBytes)/(1<<20), "est-MiB/file")
			runtime.KeepAlive(s)
		})
	}
}
