package unwind

import (
	"os"
	"testing"
)

func TestEstimateRowsCoversParsedTables(t *testing.T) {
	const libc = "/usr/lib/x86_64-linux-gnu/libc.so.6"
	if _, err := os.Stat(libc); err != nil {
		t.Skip("no libc at", libc)
	}
	f, err := os.Open(libc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tab, err := Read(f)
	if err != nil {
		t.Fatal(err)
	}
	// Without the floor, the estimate must cover what parsing produces.
	est := EstimateRows([]string{libc, libc, libc, libc, libc, libc, libc, libc, libc, libc})
	if est < 10*len(tab.Rows) || est > maxEstimatedRows {
		t.Errorf("estimate %d for ten libc tables of %d rows", est, len(tab.Rows))
	}
	if EstimateRows(nil) != minEstimatedRows {
		t.Errorf("an empty host gets %d rows, want the floor %d", EstimateRows(nil), minEstimatedRows)
	}
}

func TestMappedExecutablesOfSelf(t *testing.T) {
	files := MappedExecutables("/proc", []uint32{uint32(os.Getpid())})
	if len(files) == 0 {
		t.Fatal("the test process maps no executable file?")
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
