package symbolize

import (
	"os"
	"runtime"
	"testing"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/trace"
)

func heapAlloc() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// withinFactor fails unless the estimate is within a factor of 2 of what the heap
// says.
func withinFactor(t *testing.T, what string, estimate, measured int64) {
	t.Helper()
	t.Logf("%s: estimate %d bytes, heap %d bytes", what, estimate, measured)
	if measured <= 0 || estimate < measured/2 || estimate > measured*2 {
		t.Errorf("%s: estimated %d bytes, the heap says %d", what, estimate, measured)
	}
}

// The byte bounds are only as good as the estimates they add up: what Shed drops
// from each cache, as the heap measures it, is within a factor of 2 of the
// estimate, for the C library with its DWARF (files, decoded units, named
// addresses) and for a large Go binary.
func TestCacheEstimatesMatchHeap(t *testing.T) {
	lib := "/usr/lib/x86_64-linux-gnu/libc.so.6"
	if _, err := os.Stat(lib); err != nil {
		testenv.Unavailable(t, "no %s", lib)
	}
	libc := libcLocations(t)
	compiler := goCompiler(t)
	gm := wholeFile(t, compiler, objfile.Key{Dev: 1, Inode: 400})
	gm.File.IsGo = true
	goLocs := locationsAt(t, gm, spreadText(t, compiler, 3000))

	for _, tc := range []struct {
		name string
		locs []*trace.Location
	}{{"libc", libc}, {"go", goLocs}} {
		t.Run(tc.name, func(t *testing.T) {
			reset(tc.locs)
			s := New(Options{AddressCacheSize: 1 << 20, AddressCacheBytes: 1 << 30, DWARFCacheBytes: 1 << 30})
			if errs := s.Symbolize(&trace.Profile{Locations: tc.locs}); len(errs) != 0 {
				t.Fatal(errs)
			}
			reset(tc.locs) // only the caches hold the lines now
			st := s.Stats()
			if st.CachedAddresses < len(tc.locs)/2 {
				t.Fatalf("%d addresses cached of %d", st.CachedAddresses, len(tc.locs))
			}

			// The address cache alone first: its lines' strings may be the decoded
			// units', which stay.
			before := heapAlloc()
			s.addrs.Clear()
			withinFactor(t, "named addresses", st.CachedAddressBytes, before-heapAlloc())

			before = heapAlloc()
			s.units.Shed()
			if st.CachedDWARFBytes > 0 {
				withinFactor(t, "decoded DWARF units", st.CachedDWARFBytes, before-heapAlloc())
			}

			before = heapAlloc()
			s.Shed()
			withinFactor(t, "parsed files", st.CachedFileBytes, before-heapAlloc())
			runtime.KeepAlive(s)
		})
	}
}
