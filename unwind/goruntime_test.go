//go:build amd64

package unwind

import (
	"debug/elf"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
)

// goToolchains are the releases the tests build with: today's go on PATH and an older
// one the go command downloads (and caches).
var goToolchains = []string{"", "go1.23.4"}

func readGoRuntime(t *testing.T, path string) (*GoRuntime, *elf.File) {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fh.Close() })
	f, err := elf.NewFile(fh)
	if err != nil {
		t.Fatal(err)
	}
	g, err := ReadGoRuntime(f, fh)
	if err != nil {
		t.Fatal(err)
	}
	return g, f
}

// The table of layouts by release must say what the DWARF of binaries those releases
// build says; stripping the DWARF must leave the same layout, read from the table.
func TestGoLayoutsMatchDWARF(t *testing.T) {
	strip := testenv.RequireTool(t, "strip")
	for _, tc := range goToolchains {
		bin := testprog.BuildGoWith(t, testprog.GoGC, tc, "CGO_ENABLED=0")
		g, f := readGoRuntime(t, bin)
		if goMinor(g.Version) > goMinorMax {
			t.Fatalf("%s is newer than the table of layouts (go1.%d): check its layout and add it", g.Version, goMinorMax)
		}
		if g.Layout == nil || g.LayoutSource != "version" {
			t.Fatalf("%s (%s): layout %+v from %q, want it from the table of releases", tc, g.Version, g.Layout, g.LayoutSource)
		}
		fromDWARF, ok := dwarfLayout(f)
		if !ok {
			t.Fatalf("%s: no layout in the DWARF", g.Version)
		}
		fromDWARF.CgoDepth, fromDWARF.CgoG, fromDWARF.TlsG = g.Layout.CgoDepth, g.Layout.CgoG, g.Layout.TlsG
		if *fromDWARF != *g.Layout {
			t.Errorf("%s: the table of releases says %+v, DWARF %+v", g.Version, *g.Layout, *fromDWARF)
		}
		stripped := bin + ".stripped"
		if out, err := exec.Command(strip, "--strip-debug", "-o", stripped, bin).CombinedOutput(); err != nil {
			t.Fatalf("strip: %v\n%s", err, out)
		}
		s, _ := readGoRuntime(t, stripped)
		if s.Layout == nil || *s.Layout != *g.Layout {
			t.Errorf("%s stripped: layout %+v, unstripped %+v", g.Version, s.Layout, *g.Layout)
		}
		if g.Layout.TlsG != -8 {
			t.Errorf("%s: an internally linked binary keeps g at -8(FS), not %d", g.Version, g.Layout.TlsG)
		}
		t.Logf("%s: %+v", g.Version, *g.Layout)
	}
}

// A Go binary's table marks the runtime's switches where the symbol table puts them,
// walks Go code by frame pointer, and keeps cgo's C code on its .eh_frame rows.
func TestGoTable(t *testing.T) {
	testenv.RequireTool(t, "gcc")
	for _, tc := range goToolchains {
		bin := testprog.BuildGoWith(t, testprog.GoCgo, tc, "CGO_ENABLED=1")
		g, f := readGoRuntime(t, bin)
		// runtime.tlsg (8 bytes) and the C code's int make a TLS block of 16.
		if g.Layout == nil || g.Layout.TlsG != -16 {
			t.Fatalf("%s: an externally linked binary's g is at the start of its TLS block, -16(FS): %+v", g.Version, g.Layout)
		}
		tab, err := goTable(f, g)
		if err != nil {
			t.Fatal(err)
		}
		checkSorted(t, tab)
		syms, err := f.Symbols()
		if err != nil {
			t.Fatal(err)
		}
		addr := map[string]elf.Symbol{}
		for _, s := range syms {
			addr[strings.TrimSuffix(s.Name, ".abi0")] = s
			if strings.HasSuffix(s.Name, ".abi0") {
				addr[s.Name] = s
			}
		}
		sym := func(name string) elf.Symbol {
			if s, ok := addr[name+".abi0"]; ok {
				return s
			}
			s, ok := addr[name]
			if !ok {
				t.Fatalf("%s: no symbol %s", g.Version, name)
			}
			return s
		}
		for name, kind := range goFuncRules {
			if _, ok := addr[name]; !ok && goFuncOptional[name] {
				continue // linked only where used
			}
			s := sym(name)
			for _, pc := range []uint64{s.Value, s.Value + s.Size - 1} {
				if r := lookupRule(tab, pc); r.CFA != CFAGo || GoFunc(r.CFAReg) != kind {
					t.Errorf("%s: %s at %#x is %s, want Go function %d", g.Version, name, pc, r.String(), kind)
				}
			}
		}
		for _, name := range []string{"crosscall2", "runtime.sigtramp"} {
			s := sym(name)
			if r := lookupRule(tab, s.Value); r.CFA != CFASP || r.CFAOffset != 8 {
				t.Errorf("%s: %s starts with %s, want rsp+8", g.Version, name, r.String())
			}
			deepest := int32(0)
			for _, r := range tab.Rows {
				if r.PC >= s.Value && r.PC < s.Value+s.Size && r.CFA == CFASP {
					deepest = max(deepest, r.CFAOffset)
				}
			}
			// Both save the C ABI's callee-saved registers (PUSH_REGS_HOST_TO_ABI0) and more.
			if deepest < 64 {
				t.Errorf("%s: %s moves the stack %d bytes at most", g.Version, name, deepest)
			}
		}
		s := sym("runtime.sigreturn__sigaction")
		if r := lookupRule(tab, s.Value-1); r.CFA != CFASignal {
			t.Errorf("%s: the byte before Go's signal restorer is %s, want signal", g.Version, r.String())
		}
		if r := lookupRule(tab, sym("main.callC").Value+4); r.CFA != CFAFramePointer {
			t.Errorf("%s: Go code is %s, want frame pointer", g.Version, r.String())
		}
		// The C functions of the cgo preamble come with CFI.
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) == elf.STT_FUNC && strings.HasPrefix(s.Name, "cgo_inner") {
				if r := lookupRule(tab, s.Value); r.CFA != CFASP {
					t.Errorf("%s: C function %s is %s, want its CFI", g.Version, s.Name, r.String())
				}
			}
		}
		if !slices.ContainsFunc(tab.Rows, func(r Row) bool { return r.CFA == CFAGo && GoFunc(r.CFAReg) == GoFuncFPSwitch }) {
			t.Errorf("%s: no cgocallback row", g.Version)
		}
		t.Logf("%s: %d rows, layout %+v", g.Version, len(tab.Rows), *g.Layout)
	}
}

// goFuncOptional are the runtime functions a program need not link.
var goFuncOptional = map[string]bool{"runtime.walltime": true, "runtime.nanotime1": true, "time.now": true}

func TestGoMinor(t *testing.T) {
	for v, want := range map[string]int{"go1.26.8": 26, "go1.21.0": 21, "devel go1.27-abcdef": 27, "": 0, "go2": 0} {
		if got := goMinor(v); got != want {
			t.Errorf("goMinor(%q) = %d, want %d", v, got, want)
		}
	}
}

func TestOverlay(t *testing.T) {
	rows := []Row{{PC: 0, CFA: CFAFramePointer}, {PC: 0x100, CFA: CFASP, CFAOffset: 8}, {PC: 0x110, CFA: CFAFramePointer}}
	got := overlay(rows, []Row{
		{PC: 0x40, CFA: CFAGo, CFAReg: uint8(GoFuncTop)}, {PC: 0x48},
		{PC: 0x108, CFA: CFASP, CFAOffset: 16}, {PC: 0x120},
	})
	want := []Row{
		{PC: 0, CFA: CFAFramePointer}, {PC: 0x40, CFA: CFAGo, CFAReg: uint8(GoFuncTop)}, {PC: 0x48, CFA: CFAFramePointer},
		{PC: 0x100, CFA: CFASP, CFAOffset: 8}, {PC: 0x108, CFA: CFASP, CFAOffset: 16}, {PC: 0x120, CFA: CFAFramePointer},
	}
	if !slices.Equal(got, want) {
		t.Errorf("overlay:\n got %+v\nwant %+v", got, want)
	}
	// Two rows of a range at one address (a corrupt pclntab's), the later with the rule of
	// the row before them: it takes the address, and the two runs of one rule are one row
	// (a seed of FuzzRead found this).
	rows = []Row{{PC: 0, CFA: CFASP, CFAOffset: 88}, {PC: 0x80, CFA: CFASP, CFAOffset: 8}}
	got = overlay(rows, []Row{{PC: 0x40, CFA: CFAFramePointer}, {PC: 0x40, CFA: CFASP, CFAOffset: 88}, {PC: 0x60}})
	want = []Row{{PC: 0, CFA: CFASP, CFAOffset: 88}, {PC: 0x80, CFA: CFASP, CFAOffset: 8}}
	if !slices.Equal(got, want) {
		t.Errorf("overlay over a row of the same rule as the one before:\n got %+v\nwant %+v", got, want)
	}
}

// GoProbes point at the frame-pointer push of runtime.gopark's and runtime.execute's
// prologues, in binaries of today's Go and an older one, and the Go table walks from the
// park probe by the stack pointer.
func TestGoProbes(t *testing.T) {
	testenv.RequireTool(t, "gcc")
	for _, tc := range goToolchains {
		bin := testprog.BuildGoWith(t, testprog.GoCgo, tc, "CGO_ENABLED=1")
		g, f := readGoRuntime(t, bin)
		syms, err := f.Symbols()
		if err != nil {
			t.Fatal(err)
		}
		entries := map[string]elf.Symbol{}
		for _, s := range syms {
			if s.Name == goParkProbe || s.Name == goExecuteProbe {
				entries[s.Name] = s
			}
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		for name, probe := range map[string]uint64{goParkProbe: g.Probes.Park, goExecuteProbe: g.Probes.Execute} {
			entry, ok := vaddrToOffset(f, entries[name].Value)
			if !ok || probe <= entry || probe > entry+64 || uint64(len(data)) < probe+4 || !slices.Equal(data[probe:probe+4], framePointerSet) {
				t.Errorf("%s: %s probe at %#x, want its prologue's PUSHQ BP (entry %#x)", g.Version, name, probe, entry)
				continue
			}
			t.Logf("%s: %s probe at +%d", g.Version, name, probe-entry)
		}
		tab, err := goTable(f, g)
		if err != nil {
			t.Fatal(err)
		}
		parkEntry, _ := vaddrToOffset(f, entries[goParkProbe].Value)
		parkAt := entries[goParkProbe].Value + g.Probes.Park - parkEntry
		if row, ok := tab.Lookup(parkAt); !ok || row.CFA != CFASP || row.CFAOffset != 8 || row.FP != FPUnchanged {
			t.Errorf("%s: the row at the park probe %#x is %+v, want CFA = SP+8 with the caller's frame pointer", g.Version, parkAt, row)
		}
		if row, ok := tab.Lookup(parkAt + 1); !ok || row.CFA != CFAFramePointer {
			t.Errorf("%s: the row after the park probe is %+v, want frame pointers again", g.Version, row)
		}
	}
}

// A stripped binary has no runtime.text symbol and its pclntab header may say text
// starts at 0: its functions, and so its rows and probes, are where the unstripped
// build's are, from .text checked against runtime.goexit's code.
func TestGoStrippedBinary(t *testing.T) {
	for _, tc := range goToolchains {
		plain := testprog.BuildGoWith(t, testprog.GoGC, tc, "CGO_ENABLED=0")
		stripped := testprog.BuildGoWith(t, testprog.GoGC, tc, "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false -ldflags=-s")
		want, _ := readGoRuntime(t, plain)
		got, f := readGoRuntime(t, stripped)
		if syms, _ := f.Symbols(); len(syms) != 0 {
			t.Fatalf("%s: the stripped build has %d symbols", want.Version, len(syms))
		}
		if got.Probes == (GoProbes{}) || got.Probes != want.Probes || !slices.Equal(got.Rows, want.Rows) {
			t.Errorf("%s: stripped: probes %+v and %d rows; unstripped: %+v and %d rows", want.Version, got.Probes, len(got.Rows), want.Probes, len(want.Rows))
		}
	}
}

// prologuePush takes only the compiler's prologue: a probe anywhere but on an
// instruction's start would corrupt the program.
func TestProloguePush(t *testing.T) {
	for _, tc := range []struct {
		code []byte
		want int
		ok   bool
	}{
		{[]byte{0x49, 0x3b, 0x66, 0x10, 0x0f, 0x86, 1, 2, 0, 0, 0x55, 0x48, 0x89, 0xe5}, 10, true},
		{[]byte{0x49, 0x3b, 0x66, 0x10, 0x76, 0x20, 0x55, 0x48, 0x89, 0xe5}, 6, true},
		{[]byte{0x55, 0x48, 0x89, 0xe5}, 0, false},                                     // C's prologue
		{[]byte{0x49, 0x3b, 0x66, 0x10, 0x0f, 0x86, 1, 2, 0, 0, 0x48, 0x83}, 0, false}, // no push
		{[]byte{0x49, 0x3b, 0x66, 0x10, 0x0f, 0x86, 1}, 0, false},                      // cut short
	} {
		if got, ok := prologuePush(tc.code); got != tc.want || ok != tc.ok {
			t.Errorf("% x: %d %v, want %d %v", tc.code, got, ok, tc.want, tc.ok)
		}
	}
}
