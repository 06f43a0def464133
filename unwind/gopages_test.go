//go:build amd64

package unwind

import (
	"os"
	"testing"
	"unsafe"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
)

// Reading a Go program's runtime scans every function of its pclntab by name; the scan
// gives back what it read as it goes, so that a large program (the Collector's 13 MB
// table) is not all resident at once when a process of it appears.
func TestGoRuntimeScanGivesBackPages(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h, ef, region := mapHost(t, self)
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
	lo := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(region.Bytes()))))
	hi := lo + uint64(len(region.Bytes()))
	got := testenv.Resident(t, func(start, end uint64, _ string) bool { return start < hi && end > lo })
	t.Logf("resident %d KB of pclntab %d KB", got>>10, pcln.Size>>10)
	if got > int64(pcln.Size)/4 {
		t.Errorf("%d KB of the file resident after the scan of a %d KB pclntab", got>>10, pcln.Size>>10)
	}
}
