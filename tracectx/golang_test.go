package tracectx

import (
	"debug/elf"
	"errors"
	"go/version"
	"os"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testprog"
)

func readGoRuntime(t *testing.T, path string) (*GoRuntime, error) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ef, err := elf.NewFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return ReadGoRuntime(ef, f)
}

// The table that serves stripped programs agrees with the DWARF of the releases at hand:
// today's Go and Go 1.23, the last with labels in a map.
func TestGoRuntimeTable(t *testing.T) {
	for _, toolchain := range []string{"local", "go1.23.4"} {
		t.Run(toolchain, func(t *testing.T) {
			bin := testprog.BuildGoLabels(t, toolchain)
			rt, err := readGoRuntime(t, bin)
			if err != nil {
				t.Fatal(err)
			}
			if rt.FromDWARF || rt.GOffset != -8 {
				t.Fatalf("%+v: want offsets from the table, g at -8 from the thread pointer", rt)
			}
			lang := version.Lang(rt.Version)
			ef, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer ef.Close()
			d, err := ef.DWARF()
			if err != nil {
				t.Fatal(err)
			}
			fromDWARF, ok := dwarfOffsets(d)
			if !ok {
				t.Fatalf("%s: no offsets in the DWARF", rt.Version)
			}
			if _, ok := goOffsets[lang]; !ok {
				t.Fatalf("no table entry for %s: add %v", lang, fromDWARF)
			}
			if got := [3]uint32{rt.GM, rt.MCurg, rt.GLabels}; got != fromDWARF {
				t.Errorf("%s: DWARF says %v, the table %v", rt.Version, fromDWARF, got)
			}
			if rt.SliceLabels != (version.Compare(lang, "go1.24") >= 0) {
				t.Errorf("%s: slice labels %v", rt.Version, rt.SliceLabels)
			}

			stripped, err := readGoRuntime(t, testprog.BuildGoLabels(t, toolchain, "-ldflags=-s -w"))
			if err != nil {
				t.Fatal(err)
			}
			if stripped.FromDWARF || stripped.GM != rt.GM || stripped.MCurg != rt.MCurg || stripped.GLabels != rt.GLabels || stripped.GOffset != rt.GOffset {
				t.Errorf("stripped: %+v, with DWARF: %+v", stripped, rt)
			}
		})
	}
}

func TestReadGoRuntimeRefuses(t *testing.T) {
	if _, err := readGoRuntime(t, "/bin/sh"); !errors.Is(err, ErrNotGo) {
		t.Errorf("a C program: %v", err)
	}
}
