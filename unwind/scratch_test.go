package unwind

import (
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// Rows built in scratch memory are the rows built on the heap, and a large library's
// costs the heap a fraction of them: on the heap libc's table allocated 1.4 times its
// rows, libpython's 2.3 times (the estimate erred low and the slice regrew).
func TestScratchRows(t *testing.T) {
	requireFile(t, libcPath)
	_, f, _ := mapHost(t, libcPath)
	heap, err := FromELF(f)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	scratch, err := fromELF(f, true)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if scratch.scratch == nil {
		t.Fatal("the rows were built on the heap")
	}
	if !slices.Equal(heap.Rows, scratch.Rows) {
		t.Fatalf("%d rows in scratch memory differ from the %d built on the heap", len(scratch.Rows), len(heap.Rows))
	}
	rowBytes := uint64(len(heap.Rows)) * uint64(unsafe.Sizeof(Row{}))
	// What stays on the heap is the FDEs' list and the CIEs.
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d rows, %d bytes: %d bytes of heap allocated", len(heap.Rows), rowBytes, alloc)
	if alloc > rowBytes/2 {
		t.Errorf("building %d rows (%d bytes) in scratch memory allocated %d bytes of heap", len(heap.Rows), rowBytes, alloc)
	}
	want, err := heap.KernelRows()
	if err != nil {
		t.Fatal(err)
	}
	got, err := scratch.KernelRows()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(want, got) {
		t.Error("the kernel rows made in scratch memory differ")
	}
	scratch.release()
	if scratch.scratch != nil || scratch.Rows != nil {
		t.Error("release kept the scratch memory")
	}
	scratch.release() // twice is harmless
}

// readTable hands back rows that stay valid until release, whatever the file.
func TestReadTableRelease(t *testing.T) {
	requireFile(t, libcPath)
	rows, _, _, _, release, err := readTable(objfile.HostFile(objfile.Key{}, libcPath), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) < 1000 {
		t.Fatalf("%d rows for libc", len(rows))
	}
	runtime.GC() // the table's scratch memory must outlive a collection while release is held
	n := 0
	for _, r := range rows {
		if r.CfaRule != uint8(CFAInvalid) {
			n++
		}
	}
	if n == 0 {
		t.Error("no row with a rule")
	}
	release()
	_, _, _, _, release, err = readTable(objfile.HostFile(objfile.Key{}, "/nonexistent/lib.so"), nil)
	if err == nil {
		t.Error("a missing file was read")
	}
	release() // callable on every path
}
