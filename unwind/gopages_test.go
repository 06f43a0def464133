//go:build amd64

package unwind

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/objfile"
)

// residentOf sums the resident pages of the process's mappings that lie in region.
func residentOf(t *testing.T, region []byte) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	lo := uint64(unsafePointer(region))
	hi := lo + uint64(len(region))
	var total int64
	in := false
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			a, z, _ := strings.Cut(f[0], "-")
			start, _ := strconv.ParseUint(a, 16, 64)
			end, _ := strconv.ParseUint(z, 16, 64)
			in = start < hi && end > lo
		case in && len(f) >= 2 && f[0] == "Rss:":
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			total += kb << 10
		}
	}
	return total
}

// Reading a Go program's runtime scans every function of its pclntab by name; the scan
// gives back what it read as it goes, so that a large program (the Collector's 13 MB
// table) is not all resident at once when a process of it appears.
func TestGoRuntimeScanGivesBackPages(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h, err := objfile.OpenHost(self)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ef, region, err := h.MapELF()
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	pcln := ef.Section(".gopclntab")
	if pcln == nil || pcln.Size < 2<<20 {
		t.Fatalf("the test binary's pclntab is %v: too small to tell", pcln)
	}
	region.Release(region.Bytes())
	var g *GoRuntime
	if fault := mmapfile.Guard(func() { g, err = ReadGoRuntime(ef, h) }); fault != nil || err != nil {
		t.Fatal(fault, err)
	}
	if len(g.Rows) == 0 {
		t.Fatal("no rows: the scan found no runtime function")
	}
	// What stays: the last window of the scan, and what the functions found read.
	t.Logf("resident %d KB of pclntab %d KB", residentOf(t, region.Bytes())>>10, pcln.Size>>10)
	if got := residentOf(t, region.Bytes()); got > int64(pcln.Size)/4 {
		t.Errorf("%d KB of the file resident after the scan of a %d KB pclntab", got>>10, pcln.Size>>10)
	}
}

func unsafePointer(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
