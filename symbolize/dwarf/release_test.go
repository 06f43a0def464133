package dwarf

import (
	"debug/elf"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
)

// plainDWARFProgram links enough of the standard library for megabytes of DWARF.
const plainDWARFProgram = `package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
)

func main() {
	if len(os.Args) > 1 {
		http.ListenAndServe(os.Args[1], http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(r.Header)
		}))
	}
	fmt.Println("ok")
}
`

// The index walk gives back the pages it passed of sections read in place, and each
// unit's decoding what it read once done: a Go program's DWARF left uncompressed (2.1 MB
// of .debug_info, 1 MB of .debug_line) was resident as far as the walk had read, as
// libpython's 7.6 MB was in sonde until the naming pass ended; after 50 lookups, 2.7 MB
// of it was, against 28 KB now.
func TestIndexGivesBackPages(t *testing.T) {
	bin := testprog.BuildGoWith(t, plainDWARFProgram, "", "GOFLAGS=-buildvcs=false -ldflags=-compressdwarf=false")
	dropCached(t, bin)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	info := f.Section(".debug_info")
	if info == nil || info.Flags&elf.SHF_COMPRESSED != 0 || info.Size < 2<<20 {
		t.Fatalf(".debug_info: %+v: the test needs 2 MB of it, uncompressed", info)
	}
	osf, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	m, err := mmapfile.Map(osf)
	osf.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	lo := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(m.Bytes()))))
	hi := lo + uint64(len(m.Bytes()))
	var tab *Table
	if fault := mmapfile.Guard(func() { tab, err = Load(f, Options{File: m.Bytes(), Release: m.Release}) }); fault != nil || err != nil {
		t.Fatalf("load: %v %v", fault, err)
	}
	defer tab.Close()
	resident := testenv.Resident(t, func(start, end uint64, _ string) bool { return start < hi && end > lo })
	t.Logf("%d KiB of the file resident after the index of %d KiB of .debug_info", resident>>10, info.Size>>10)
	// 376 KiB here, against 940 KiB when the walk gave nothing back.
	if resident > 640<<10 {
		t.Errorf("the index walk left %d KiB of the file resident", resident>>10)
	}
	named := 0
	addrs := spread(t, f, ".text", 50)
	if fault := mmapfile.Guard(func() {
		for _, a := range addrs {
			if len(lookup(t, tab, a)) > 0 {
				named++
			}
		}
	}); fault != nil {
		t.Fatal(fault)
	}
	if named < len(addrs)*9/10 {
		t.Errorf("%d of %d addresses named after the pages were given back", named, len(addrs))
	}
	// Each unit decoded gives back what it read: a naming pass over libpython's units
	// held 4.3 MB of the file resident at once until it ended.
	resident = testenv.Resident(t, func(start, end uint64, _ string) bool { return start < hi && end > lo })
	t.Logf("%d KiB of the file resident after %d lookups", resident>>10, len(addrs))
	if resident > 640<<10 {
		t.Errorf("decoding the units of %d addresses left %d KiB of the file resident", len(addrs), resident>>10)
	}
}

// dropCached writes a file's pages out and drops them from the page cache, so that a
// mapping faults them in from disk as it would a program's on the host.
func dropCached(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}
