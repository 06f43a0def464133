package pipeline

import (
	"debug/elf"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"golang.org/x/sys/unix"
)

// Releasing the executable's read-only pages covers its code and lets the process go on:
// what runs next faults its pages back in from the file.
func TestReleaseOwnCode(t *testing.T) {
	n, err := releaseOwnCode(false)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Stat("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if n <= 0 || n > exe.Size()+1<<20 {
		t.Fatalf("released %d bytes of a %d-byte executable", n, exe.Size())
	}
	// Code and read-only data in use again: formatting and parsing touch both.
	if got := strings.Repeat(strconv.Itoa(42), 2); got != "4242" {
		t.Fatalf("after the release: %q", got)
	}
}

// After an exact release, naming functions reads the pages of pclntab it needs and no
// more: without it each page read brought up to 16 of its neighbours along.
func TestReleaseOwnCodeExactly(t *testing.T) {
	exe, err := elf.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	pclntab := exe.Section(".gopclntab")
	if pclntab == nil {
		t.Fatal("no .gopclntab in the test binary")
	}
	text := exe.Section(".text")
	if text == nil || text.Size < 1<<20 {
		t.Fatal("the test binary has no large .text")
	}
	var fs unix.Statfs_t
	if err := unix.Statfs("/proc/self/exe", &fs); err == nil && fs.Type == unix.TMPFS_MAGIC {
		t.Skip("the test binary is on tmpfs, whose pages cannot leave the cache: the release is exact only on a disk")
	}
	const names = 64
	inTable := func(start, end uint64, _ string) bool {
		return start <= pclntab.Addr && pclntab.Addr < end
	}

	if _, err := releaseOwnCode(true); err != nil {
		t.Fatal(err)
	}
	before := testenv.Resident(t, inTable)
	named := 0
	for i := range names {
		pc := uintptr(text.Addr + uint64(i)*(text.Size/names))
		if f := runtime.FuncForPC(pc); f != nil && f.Name() != "" {
			if file, line := f.FileLine(pc); file != "" && line > 0 {
				named++
			}
		}
	}
	grown := testenv.Resident(t, inTable) - before
	if named < names/2 {
		t.Fatalf("named %d of %d functions", named, names)
	}
	// Finding a function and its name, file and line reads a handful of scattered places
	// of the table (about six pages each, measured); 16 pages around each of them was
	// 11.6 MB here without the exact release.
	if limit := int64(names * 12 * os.Getpagesize()); grown > limit {
		t.Fatalf("naming %d functions made %d KB of pclntab resident, want at most %d KB", names, grown>>10, limit>>10)
	}
	t.Logf("naming %d functions: %d KB of pclntab resident", names, grown>>10)
}

// The first two intervals end with a release (start-up and the first naming; then the
// first export's one-time work), and from then on the cache alone is dropped, once a
// minute whatever the interval.
func TestOwnPagesSchedule(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	var o ownPages
	var got []ownPagesStep
	for i := 1; i <= 30; i++ {
		got = append(got, o.intervalEnd(t0.Add(time.Duration(i)*5*time.Second)))
	}
	want := make([]ownPagesStep, 30)
	want[0], want[1] = ownRelease, ownRelease
	// The second release is at 10 s: drops at 70 s and 130 s (intervals 14 and 26).
	want[13], want[25] = ownDropCache, ownDropCache
	if !slices.Equal(got, want) {
		t.Fatalf("steps at 5 s intervals:\n got %v\nwant %v", got, want)
	}
	// A long interval drops at each end after the releases.
	var l ownPages
	for i, want := range []ownPagesStep{ownRelease, ownRelease, ownDropCache, ownDropCache} {
		if got := l.intervalEnd(t0.Add(time.Duration(i+1) * 2 * time.Minute)); got != want {
			t.Fatalf("2-minute interval %d: %v, want %v", i+1, got, want)
		}
	}
}
