package dwarf

import (
	"debug/elf"
	"errors"
	"os"
	"testing"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/testprog"
)

// loadShared loads bin's DWARF with a cache shared with other tables.
func loadShared(t *testing.T, bin string, c *Cache) (*elf.File, *Table, error) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	m := mapFile(t, bin)
	tab, err := Load(f, Options{File: m.Bytes(), Cache: c})
	if tab != nil {
		t.Cleanup(tab.Close)
	}
	return f, tab, err
}

// mapFile maps path for the test's length.
func mapFile(t testing.TB, path string) *mmapfile.Region {
	t.Helper()
	osf, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer osf.Close()
	m, err := mmapfile.Map(osf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// packedSize is what t's compressed sections inflate to.
func packedSize(t *Table) int64 {
	var n int64
	for _, sec := range t.secs {
		if sec.packed != nil {
			n += int64(sec.size)
		}
	}
	return n
}

// wholeSize is what t's compressed sections decompressed whole inflate to: all but
// those decompressed a block at a time.
func wholeSize(t *Table) int64 {
	var n int64
	for _, sec := range t.secs {
		if sec.packed != nil && sec.lazy == nil {
			n += int64(sec.size)
		}
	}
	return n
}

// Tables sharing a cache hold at most its bound of decompressed sections together: a
// lookup in one drops the copies of the one used longest ago, and a table whose copies
// alone exceed the bound is refused at load rather than let through.
func TestDecompressedBound(t *testing.T) {
	bin := testprog.BuildCXX(t, "-O2", "-gdwarf-4", "-gz")
	probe := NewCache(1 << 20)
	_, one, err := loadShared(t, bin, probe)
	if err != nil {
		t.Fatal(err)
	}
	size := packedSize(one)
	if size == 0 {
		t.Fatal("the -gz build has no compressed section")
	}
	// Building the index reads .debug_info, .debug_abbrev and .debug_line a block at a
	// time and keeps none of them but their marks: no lookup was announced.
	marks := one.MarkBytes()
	if got, whole := probe.Decompressed(), wholeSize(one); got.Bytes != whole+marks || got.PeakBytes > size+marks || got.TotalBytes < size {
		t.Errorf("unbounded cache after a load: %+v, want %d held, at most %d at once, %d or more decompressed", got, whole+marks, size+marks, size)
	}
	one.Trim()
	if got := probe.Decompressed(); got.Bytes != marks {
		t.Errorf("%d bytes held after Trim, not the marks' %d", got.Bytes, marks)
	}

	// Room for two files' copies, not three.
	c := NewCache(1 << 20)
	c.LimitDecompressed(2*size + size/2)
	var tabs []*Table
	var f *elf.File
	for range 3 {
		var tab *Table
		f, tab, err = loadShared(t, bin, c)
		if err != nil {
			t.Fatal(err)
		}
		tabs = append(tabs, tab)
	}
	if got := c.Decompressed(); got.Bytes > 2*size+size/2 || got.PeakBytes > 2*size+size/2 {
		t.Errorf("three loads hold %+v, over the bound of %d", got, 2*size+size/2)
	}
	addr := spread(t, f, ".text", 1)[0]
	for round := range 3 {
		for i, tab := range tabs {
			if _, err := tab.Lookup(addr + uint64(round)); err != nil {
				t.Fatalf("table %d: %v", i, err)
			}
		}
	}
	got := c.Decompressed()
	if got.PeakBytes > 2*size+size/2 {
		t.Errorf("peak %d bytes decompressed, over the bound of %d", got.PeakBytes, 2*size+size/2)
	}
	if got.Bytes <= 0 {
		t.Errorf("nothing held after lookups: %+v", got)
	}

	small := NewCache(1 << 20)
	small.LimitDecompressed(size - 1)
	if _, _, err := loadShared(t, bin, small); !errors.Is(err, ErrDecompressBudget) {
		t.Errorf("a file over the whole bound loaded with %v, want ErrDecompressBudget", err)
	}
	if got := small.Decompressed(); got.Refused != 1 || got.Bytes != 0 {
		t.Errorf("after the refusal: %+v", got)
	}
}
