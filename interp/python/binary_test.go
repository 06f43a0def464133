package python

import (
	"debug/elf"
	"slices"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/unwind"
)

// TestInspect inspects every interpreter of the machine and Debian's own builds: each is
// found, with the version it reports itself, and a layout from the source its build
// allows; where its DWARF gives one, the table agrees with it. The eval loop's out-of-line
// part is found in Debian's stripped builds, and where a build keeps its symbol, what a
// stripped copy would find is that symbol.
func TestInspect(t *testing.T) {
	for _, py := range testenv.EveryPython(t) {
		t.Run(py.Name, func(t *testing.T) {
			f, err := elf.Open(py.Lib)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			in, err := Inspect(f)
			if err != nil {
				t.Fatalf("inspect %s: %v", py.Lib, err)
			}
			if in.Version.String() != py.Version {
				t.Errorf("version %s, the interpreter says %s", in.Version, py.Version)
			}
			if in.Eval[0] == 0 || in.Eval[1] <= in.Eval[0] || in.Runtime == 0 || in.CodeType == 0 {
				t.Errorf("symbols missing: %+v", in)
			}
			t.Logf("%s: layout from %s, eval %#x-%#x, cold %#x-%#x", py.Lib, in.Layout.Source, in.Eval[0], in.Eval[1], in.EvalCold[0], in.EvalCold[1])
			// pyenv's 3.11 and 3.12 move a few bytes out of line that the head never
			// branches to (a trap after an unreachable path): not found, and no return
			// address is ever in them.
			if found := interp.OutOfLinePart(f, in.Eval[0], in.Eval[1], func() *unwind.Table { t, _ := unwind.FromELF(f); return t }); found != in.EvalCold &&
				(found != [2]uint64{} || in.EvalCold[1]-in.EvalCold[0] > 64) {
				t.Errorf("out-of-line part found from code and FDEs %#x, the symbol's %#x", found, in.EvalCold)
			}
			if py.Root != "" && in.EvalCold[1] == 0 {
				t.Errorf("no out-of-line part of the eval loop found in Debian's build")
			}
			// The __init__ shim (3.13+) is known before any process runs it: by its symbol,
			// or, in a stripped file, found among the file's data, where it is found in
			// every file that has the symbol too.
			if in.Version.AtLeast(13) {
				if in.InitShim == 0 {
					t.Errorf("no __init__ shim found")
				}
				if scanned := scanInitShim(f, in); scanned != in.InitShim {
					t.Errorf("__init__ shim found in the data at %#x, the symbol says %#x", scanned, in.InitShim)
				}
			} else if in.InitShim != 0 {
				t.Errorf("an __init__ shim at %#x before 3.13", in.InitShim)
			}
			if ft := strings.Contains(py.Name, "free-threaded"); in.Layout.FreeThreaded != ft {
				t.Errorf("layout free-threaded %v, the build %v", in.Layout.FreeThreaded, ft)
			}
			checkObjectLayout(t, f, in.Layout)
			if in.Version.Minor >= 14 {
				// Read from the interpreter's _Py_DebugOffsets only: sonde has no table.
				if in.Layout.Source != "debug_offsets" {
					t.Errorf("layout from %s", in.Layout.Source)
				}
				return
			}
			table, err := tableLayout(in.Version)
			if err != nil {
				t.Fatal(err)
			}
			got := in.Layout
			got.Source = table.Source
			if got != table {
				t.Errorf("layout from %s:\n %+v\ntable:\n %+v", in.Layout.Source, got, table)
			}
			// A release build is read from the table; its DWARF, where it has some, agrees.
			if d, err := f.DWARF(); err == nil && in.Version.Minor < 13 {
				l, err := dwarfLayout(d, in.Version)
				if err != nil {
					t.Fatalf("layout from dwarf: %v", err)
				}
				l.Source = table.Source
				if l != table {
					t.Errorf("layout from dwarf:\n %+v\ntable:\n %+v", l, table)
				}
			}
		})
	}
}

// checkObjectLayout holds the object headers' offsets, and a free-threaded build's
// thread-local bytecode fields, to the interpreter's DWARF where it has some, else to what
// every build with the GIL shares.
func checkObjectLayout(t *testing.T, f *elf.File, l Layout) {
	t.Helper()
	got := []int{l.ObType, l.UnicodeLength, l.UnicodeState, l.BytesSize, l.BytesData, l.FrameTLBC, l.CodeTLBC}
	d, err := f.DWARF()
	if err != nil {
		if want := []int{obType, unicodeLength, unicodeState, bytesSize, bytesData, noOffset, noOffset}; !slices.Equal(got, want) {
			t.Errorf("object layout %v, want %v", got, want)
		}
		return
	}
	structs, err := dwarfStructs(d, "_object", "PyASCIIObject", "PyBytesObject", "PyVarObject", "_PyInterpreterFrame", "PyCodeObject")
	if err != nil {
		t.Fatal(err)
	}
	at := func(st, name string) int {
		if s := structs[st]; s != nil {
			for _, f := range s.Field {
				if f.Name == name {
					return int(f.ByteOffset)
				}
			}
		}
		return noOffset
	}
	want := []int{at("_object", "ob_type"), at("PyASCIIObject", "length"), at("PyASCIIObject", "state"),
		at("PyBytesObject", "ob_base") + at("PyVarObject", "ob_size"), at("PyBytesObject", "ob_sval"),
		at("_PyInterpreterFrame", "tlbc_index"), at("PyCodeObject", "co_tlbc")}
	if !slices.Equal(got, want) {
		t.Errorf("object layout %v, DWARF says %v", got, want)
	}
}

// TestNotPython: files without the interpreter's symbols are told apart.
func TestNotPython(t *testing.T) {
	for _, path := range []string{"/bin/sh", "/proc/self/exe"} {
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Inspect(f); err != ErrNotPython {
			t.Errorf("%s: %v, want ErrNotPython", path, err)
		}
		f.Close()
	}
}

func TestVersionIn(t *testing.T) {
	for in, want := range map[string]string{
		"x\x00/root/.pyenv/versions/3.9.18\x00/tmp/Python-3.9.18\x003.9.18\x00lib3.2.0\x00": "3.9.18",
		"3.10.13+\x00": "3.10.13",
	} {
		v, err := versionIn([]byte(in))
		if err != nil || v.String() != want {
			t.Errorf("%q: %v %v, want %s", in, v, err, want)
		}
	}
	if _, err := versionIn([]byte("no version")); err == nil {
		t.Error("a version found where none is")
	}
}
