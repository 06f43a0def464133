package unwind

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
)

const (
	libcPath      = "/usr/lib/x86_64-linux-gnu/libc.so.6"
	libstdcxxPath = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"
	libcryptoPath = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3"
)

var buildDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "unwind-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

// testBinaries are the programs built from testdata, by variant.
var testBinaries = map[string][]string{
	"nopie": {"-O2", "-fomit-frame-pointer", "-fexceptions", "-no-pie"},
	"pie":   {"-O2", "-fomit-frame-pointer", "-fexceptions", "-pie", "-fPIE"},
	// crt1.o still brings an .eh_frame for _start, so the debug variants have it removed.
	"debugframe":   debugFrameFlags,
	"debugframe-z": debugFrameFlags, // and .debug_frame compressed
}

var debugFrameFlags = []string{"-O2", "-fomit-frame-pointer", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-g", "-DDEBUG_FRAME"}

var (
	buildMu  sync.Mutex
	built    = map[string]string{}
	buildErr = map[string]error{}
)

// testBinary builds (once) the test program variant and returns its path, or "" with
// an error when the toolchain is missing or fails.
func testBinary(variant string) (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[variant]; ok {
		return p, buildErr[variant]
	}
	p, err := buildVariant(variant)
	built[variant], buildErr[variant] = p, err
	return p, err
}

func buildVariant(variant string) (string, error) {
	out := filepath.Join(buildDir, variant)
	args := append(slices.Clone(testBinaries[variant]), "-o", out, "testdata/prog.c", "testdata/cfi.S")
	if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("gcc %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	if strings.HasPrefix(variant, "debugframe") {
		full := out + ".full"
		if err := os.Rename(out, full); err != nil {
			return "", err
		}
		args := []string{"-R", ".eh_frame", "-R", ".eh_frame_hdr"}
		if variant == "debugframe-z" {
			args = append(args, "--compress-debug-sections=zlib")
		}
		if b, err := exec.Command("objcopy", append(args, full, out)...).CombinedOutput(); err != nil {
			return "", fmt.Errorf("objcopy: %v\n%s", err, b)
		}
	}
	return out, nil
}

func requireTestBinary(t testing.TB, variant string) string {
	t.Helper()
	testenv.RequireTool(t, "gcc")
	if strings.HasPrefix(variant, "debugframe") {
		testenv.RequireTool(t, "objcopy")
	}
	p, err := testBinary(variant)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// mapHost opens a host file and parses it over a mapping, as readTable reads files: its
// sections are read in place. Both are closed when the test ends.
func mapHost(t testing.TB, path string) (*objfile.Handle, *elf.File, *mmapfile.Region) {
	t.Helper()
	h, err := objfile.OpenHost(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	f, region, err := h.MapELF()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { region.Close() })
	return h, f, region
}

func requireFile(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		testenv.Unavailable(t, "needs %s: %v", path, err)
	}
}

func TestReadelfLibc(t *testing.T) {
	requireFile(t, libcPath)
	n := compareWithReadelf(t, libcPath, ".eh_frame")
	// Guard against a comparison that silently checks nothing.
	if n.loc < 10000 || n.signal == 0 || n.plt == 0 || n.end == 0 {
		t.Errorf("libc: too little compared: %+v", n)
	}
}

func TestReadelfLibstdcxx(t *testing.T) {
	requireFile(t, libstdcxxPath)
	n := compareWithReadelf(t, libstdcxxPath, ".eh_frame")
	if n.loc < 10000 || n.plt == 0 {
		t.Errorf("libstdc++: too little compared: %+v", n)
	}
}

func TestReadelfTestBinaries(t *testing.T) {
	for _, v := range []string{"nopie", "pie"} {
		t.Run(v, func(t *testing.T) {
			p := requireTestBinary(t, v)
			n := compareWithReadelf(t, p, ".eh_frame")
			if n.fp == 0 || n.plt < 2 || n.signal == 0 || n.end == 0 || n.deref == 0 || n.reg == 0 || n.fpExpr == 0 || n.other == 0 {
				t.Errorf("%s: expected CFA-on-rbp, PLT, signal, end-of-stack, expression and register rows: %+v", v, n)
			}
		})
	}
}

// The expressions compilers and hand-written assembly emit: OpenSSL's in libcrypto, and
// gcc's stack realignment and OpenSSL-style assembly in a program built here.
func TestReadelfExpressions(t *testing.T) {
	t.Run("stacks", func(t *testing.T) {
		testenv.RequireTool(t, "gcc")
		n := compareWithReadelf(t, testprog.BuildStacks(t, "-O2", "-fomit-frame-pointer"), ".eh_frame")
		// drap (*(rbp-N), r10, rbp at rbp), expr_deref and expr_index.
		if n.deref < 3 || n.reg < 3 || n.fpExpr == 0 {
			t.Errorf("too few expression rows compared: %+v", n)
		}
	})
	t.Run("libcrypto", func(t *testing.T) {
		requireFile(t, libcryptoPath)
		n := compareWithReadelf(t, libcryptoPath, ".eh_frame")
		if n.deref < 25 || n.reg < 50 {
			t.Errorf("too few of OpenSSL's expression rows compared: %+v", n)
		}
	})
}

func TestReadelfDebugFrame(t *testing.T) {
	for _, v := range []string{"debugframe", "debugframe-z"} {
		t.Run(v, func(t *testing.T) {
			p := requireTestBinary(t, v)
			f, err := elf.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			df := f.Section(".debug_frame")
			if f.Section(".eh_frame") != nil || df == nil {
				t.Fatalf("%s: want .debug_frame and no .eh_frame", p)
			}
			if compressed := df.Flags&elf.SHF_COMPRESSED != 0; compressed != (v == "debugframe-z") {
				t.Fatalf("%s: .debug_frame compressed: %v", p, compressed)
			}
			n := compareWithReadelf(t, p, ".debug_frame")
			if n.fp == 0 || n.signal == 0 || n.end == 0 || n.plt == 0 {
				t.Errorf("expected CFA-on-rbp, PLT, signal and end-of-stack rows: %+v", n)
			}
		})
	}
}

func TestReadelfGoBinary(t *testing.T) {
	testenv.RequireTool(t, "readelf")
	gotool := testenv.RequireTool(t, "go")
	out := filepath.Join(t.TempDir(), "goprog")
	cmd := exec.Command(gotool, "build", "-o", out, "./testdata/goprog")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	compareWithReadelf(t, out, ".debug_frame")
}

// counts are what a comparison covered.
type counts struct {
	loc       int // readelf rows (and FDE ends) looked up in sonde's table
	rows      int // sonde rows checked against readelf's state at their PC
	skipped   int // readelf rows whose meaning is ambiguous (see expect)
	fp        int // compared rows with CFA on rbp
	plt       int
	signal    int
	end       int
	deref     int // CFA expressions that dereference
	reg       int // CFA on a register other than rsp and rbp
	fpExpr    int // rbp saved where an expression says
	other     int // rules the kernel counts and stops at: other expressions, the return address elsewhere
	fdes      int
	overlaped int
}

// compareWithReadelf checks sonde's table for path against readelf's interpretation of
// the named section, both ways: every readelf row gives the rule sonde looks up at its
// LOC, and every sonde row agrees with readelf's state at its PC.
func compareWithReadelf(t *testing.T, path, section string) counts {
	t.Helper()
	readelf := testenv.RequireTool(t, "readelf")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tab, err := Read(f)
	if err != nil {
		t.Fatal(err)
	}
	if tab.Source != section {
		t.Fatalf("table source %q, want %q", tab.Source, section)
	}
	checkSorted(t, tab)

	interp := runReadelf(t, readelf, "--debug-dump=frames-interp", path, section)
	raw := runReadelf(t, readelf, "--debug-dump=frames", path, section)
	for off, e := range interp.entries {
		r := raw.entries[off]
		if r == nil {
			t.Fatalf("entry %#x missing from the raw dump", off)
		}
		e.exprs, e.fpExprs = r.exprs, r.fpExprs
	}

	var fdes []*reEntry
	for _, e := range interp.order {
		if !e.cie && e.end > e.start {
			fdes = append(fdes, e)
		}
	}
	slices.SortStableFunc(fdes, func(a, b *reEntry) int {
		switch {
		case a.start < b.start:
			return -1
		case a.start > b.start:
			return 1
		}
		return 0
	})
	// FDEs that overlap others are resolved by a policy readelf knows nothing of;
	// leave their addresses out and count them.
	var n counts
	n.fdes = len(fdes)
	var maxEnd uint64
	for i, e := range fdes {
		if i > 0 && e.start < maxEnd {
			e.overlap = true
			for j := i - 1; j >= 0 && fdes[j].end > e.start; j-- {
				fdes[j].overlap = true
			}
		}
		maxEnd = max(maxEnd, e.end)
	}
	covering := func(pc uint64) (*reEntry, bool) {
		i, _ := slices.BinarySearchFunc(fdes, pc+1, func(e *reEntry, x uint64) int {
			if e.start < x {
				return -1
			}
			return 1
		})
		for j := i - 1; j >= 0; j-- {
			if fdes[j].end > pc {
				return fdes[j], !fdes[j].overlap
			}
			if !fdes[j].overlap {
				break
			}
		}
		return nil, true
	}

	fails := 0
	fail := func(format string, args ...any) {
		t.Helper()
		if fails++; fails <= 20 {
			t.Errorf(format, args...)
		}
	}
	tally := func(r Row) {
		switch r.CFA {
		case CFAFP:
			n.fp++
		case CFAPLT:
			n.plt++
		case CFASignal:
			n.signal++
		case CFAEndOfStack:
			n.end++
		case CFADeref:
			n.deref++
		case CFAReg:
			n.reg++
		case CFAExpression, CFARAElsewhere:
			n.other++
		}
		if r.FP == FPAtFP || r.FP == FPAtSP {
			n.fpExpr++
		}
	}

	// readelf → sonde.
	for _, e := range fdes {
		if e.overlap {
			n.overlaped++
			continue
		}
		rows := e.effectiveRows(interp.entries)
		for _, row := range rows {
			want, ok := expect(e, interp.entries[e.cieOff], row)
			if !ok {
				n.skipped++
				continue
			}
			got := lookupRule(tab, row.loc)
			n.loc++
			tally(want)
			if !sameRule(got, want) {
				fail("%s: FDE %#x at %#x: readelf %s gives %s, sonde has %s", filepath.Base(path), e.off, row.loc, row, want.String(), got.String())
			}
		}
		if c, _ := covering(e.end); c == nil {
			n.loc++
			if got := lookupRule(tab, e.end); got.CFA != CFAInvalid {
				fail("%s: FDE %#x ends at %#x, but sonde has %s there", filepath.Base(path), e.off, e.end, got.String())
			}
		}
	}

	// sonde → readelf.
	for _, r := range tab.Rows {
		e, ok := covering(r.PC)
		if !ok {
			continue
		}
		var want Row
		if e != nil {
			rows := e.effectiveRows(interp.entries)
			i, _ := slices.BinarySearchFunc(rows, r.PC+1, func(x reRow, pc uint64) int {
				if x.loc < pc {
					return -1
				}
				return 1
			})
			if i == 0 {
				fail("%s: sonde row at %#x precedes FDE %#x's rows", filepath.Base(path), r.PC, e.off)
				continue
			}
			var ok bool
			if want, ok = expect(e, interp.entries[e.cieOff], rows[i-1]); !ok {
				continue
			}
		}
		n.rows++
		if !sameRule(r, want) {
			fail("%s: sonde row at %#x is %s, readelf says %s", filepath.Base(path), r.PC, r.String(), want.String())
		}
	}
	t.Logf("%s (%s): %d FDEs, %d readelf rows and FDE ends looked up, %d sonde rows checked, %d ambiguous, %d overlapping FDEs skipped; rbp-based %d, PLT %d, signal %d, end of stack %d, dereferencing %d, other register %d, rbp by expression %d, unfollowed %d",
		path, section, n.fdes, n.loc, n.rows, n.skipped, n.overlaped, n.fp, n.plt, n.signal, n.end, n.deref, n.reg, n.fpExpr, n.other)
	return n
}

func lookupRule(tab *Table, pc uint64) Row {
	r, ok := tab.Lookup(pc)
	if !ok {
		return Row{}
	}
	return r
}

func checkSorted(t testing.TB, tab *Table) {
	t.Helper()
	for i := 1; i < len(tab.Rows); i++ {
		a, b := tab.Rows[i-1], tab.Rows[i]
		if a.PC >= b.PC {
			t.Fatalf("rows %d and %d out of order: %#x, %#x", i-1, i, a.PC, b.PC)
		}
		if sameRule(a, b) {
			t.Fatalf("rows %d and %d at %#x and %#x not merged: %s", i-1, i, a.PC, b.PC, a.String())
		}
	}
}

// reRow is one row of readelf's interpreted table: the CFA, rbp and return address columns.
type reRow struct {
	loc          uint64
	cfa, rbp, ra string
}

func (r reRow) String() string {
	return fmt.Sprintf("[cfa %s rbp %q ra %q]", r.cfa, r.rbp, r.ra)
}

// reEntry is a CIE or FDE as readelf prints it.
type reEntry struct {
	off        uint64
	cie        bool
	cieOff     uint64
	aug        string
	raCol      int
	start, end uint64
	rows       []reRow
	exprs      []string // operands of DW_CFA_def_cfa_expression, from the raw dump
	fpExprs    []string // operands of DW_CFA_expression for rbp
	overlap    bool
	effective  []reRow
}

// effectiveRows returns the FDE's rows in the FDE's range, the last of rows sharing a
// LOC (an advance by zero), or the CIE's initial row when readelf printed none because
// the FDE's program is all nops.
func (e *reEntry) effectiveRows(entries map[uint64]*reEntry) []reRow {
	if e.effective != nil {
		return e.effective
	}
	var rows []reRow
	for _, r := range e.rows {
		if r.loc < e.start || r.loc >= e.end {
			continue
		}
		if n := len(rows); n > 0 && rows[n-1].loc == r.loc {
			rows[n-1] = r
			continue
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		r := reRow{loc: e.start}
		if c := entries[e.cieOff]; c != nil && len(c.rows) > 0 {
			r = c.rows[len(c.rows)-1]
			r.loc = e.start
		}
		rows = append(rows, r)
	}
	e.effective = rows
	return rows
}

var pltExprText = regexp.MustCompile(`^DW_OP_breg7 \(rsp\): 8; DW_OP_breg16 \(rip\): 0; DW_OP_lit15; DW_OP_and; DW_OP_lit1[01]; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus$`)

// The DWARF expressions of real CFI, as readelf prints them, read here independently of
// sonde's evaluator: a register plus an offset, its dereference plus another, and
// bn_mul_mont's indexed form.
var (
	bregText   = regexp.MustCompile(`^DW_OP_breg([0-9]+) \([a-z0-9]+\): (-?[0-9]+)$`)
	derefText  = regexp.MustCompile(`^DW_OP_breg([0-9]+) \([a-z0-9]+\): (-?[0-9]+); DW_OP_deref(?:; DW_OP_plus_uconst: ([0-9]+))?$`)
	indexText  = regexp.MustCompile(`^DW_OP_breg([0-9]+) \([a-z0-9]+\): (-?[0-9]+); DW_OP_breg([0-9]+) \([a-z0-9]+\): (-?[0-9]+); DW_OP_lit([1248]); DW_OP_mul; DW_OP_plus; DW_OP_deref; DW_OP_plus_uconst: ([0-9]+)$`)
	dwarfRegNo = map[string]uint8{"rax": 0, "rdx": 1, "rcx": 2, "rbx": 3, "rsi": 4, "rdi": 5, "rbp": 6, "rsp": 7,
		"r8": 8, "r9": 9, "r10": 10, "r11": 11, "r12": 12, "r13": 13, "r14": 14, "r15": 15}
)

func atoi(s string) int64 {
	v, _ := strconv.ParseInt(s, 10, 64)
	return v
}

// cfaExprRule is the rule a CFA expression's text calls for.
func cfaExprRule(x string) Row {
	if pltExprText.MatchString(x) {
		return Row{CFA: CFAPLT}
	}
	if m := bregText.FindStringSubmatch(x); m != nil {
		return regOffRule(uint8(atoi(m[1])), atoi(m[2]))
	}
	if m := derefText.FindStringSubmatch(x); m != nil {
		return Row{CFA: CFADeref, CFAReg: uint8(atoi(m[1])), CFAOffset: int32(atoi(m[2])), CFAPost: int32(atoi(m[3]))}
	}
	if m := indexText.FindStringSubmatch(x); m != nil {
		scale := atoi(m[5])
		shift := map[int64]uint8{1: 0, 2: 1, 4: 2, 8: 3}[scale]
		return Row{CFA: CFADeref, CFAReg: uint8(atoi(m[1])), CFAOffset: int32(atoi(m[2]) + atoi(m[4])*scale),
			CFAIndex: CFAIndex | shift<<4 | uint8(atoi(m[3])), CFAPost: int32(atoi(m[6]))}
	}
	return Row{CFA: CFAExpression}
}

func regOffRule(reg uint8, off int64) Row {
	switch reg {
	case 7:
		return Row{CFA: CFASP, CFAOffset: int32(off)}
	case 6:
		return Row{CFA: CFAFP, CFAOffset: int32(off)}
	}
	return Row{CFA: CFAReg, CFAReg: reg, CFAOffset: int32(off)}
}

// fpExprRule is the frame pointer rule an expression for rbp calls for.
func fpExprRule(x string) (FPRule, int32) {
	if m := bregText.FindStringSubmatch(x); m != nil {
		switch m[1] {
		case "6":
			return FPAtFP, int32(atoi(m[2]))
		case "7":
			return FPAtSP, int32(atoi(m[2]))
		}
	}
	return FPInvalid, 0
}

// sameOf translates every expression of an FDE (and its CIE) and returns the one rule
// they share; ok is false when they differ, as readelf's "exp" does not say which is in
// force at a row.
func sameOf[T comparable](xs []string, f func(string) T) (T, bool) {
	var first T
	for i, x := range xs {
		v := f(x)
		if i == 0 {
			first = v
		} else if v != first {
			return first, false
		}
	}
	return first, len(xs) > 0
}

// expect translates a readelf row into the rule sonde must produce, independently of
// sonde's parser. ok is false when readelf's text does not determine it: a CFA or rbp
// "exp" in an FDE whose expressions differ.
func expect(e, c *reEntry, r reRow) (Row, bool) {
	if c != nil && strings.Contains(c.aug, "S") {
		return Row{CFA: CFASignal}, true
	}
	if c == nil || c.raCol != 16 {
		return Row{}, true
	}
	switch r.ra {
	case "u":
		return Row{CFA: CFAEndOfStack}, true
	case "c-8":
	default:
		return Row{CFA: CFARAElsewhere}, true
	}
	var w Row
	if r.cfa == "exp" {
		rule, ok := sameOf(append(slices.Clone(c.exprs), e.exprs...), cfaExprRule)
		if !ok {
			return Row{}, false
		}
		w = rule
		if w.CFA == CFAExpression || w.CFA == CFAPLT {
			return w, true
		}
	} else {
		m := cfaText.FindStringSubmatch(r.cfa)
		if m == nil {
			return Row{}, true
		}
		reg, known := dwarfRegNo[m[1]]
		if !known {
			return Row{CFA: CFAReg, CFAReg: uint8(atoi(strings.TrimPrefix(m[1], "r"))), CFAOffset: int32(atoi(m[2]))}, true
		}
		off, err := strconv.ParseInt(m[2], 10, 32)
		if err != nil {
			return Row{}, true
		}
		w = regOffRule(reg, off)
	}
	switch {
	case r.rbp == "" || r.rbp == "u" || r.rbp == "s" || r.rbp == "r6(rbp)":
		w.FP = FPUnchanged
	case strings.HasPrefix(r.rbp, "c"):
		off, err := strconv.ParseInt(r.rbp[1:], 10, 32)
		if err != nil {
			w.FP = FPInvalid
		} else {
			w.FP, w.FPOffset = FPAtCFA, int32(off)
		}
	case r.rbp == "exp":
		type fpRule struct {
			rule FPRule
			off  int32
		}
		rule, ok := sameOf(append(slices.Clone(c.fpExprs), e.fpExprs...), func(x string) fpRule {
			r, off := fpExprRule(x)
			return fpRule{r, off}
		})
		if !ok {
			return Row{}, false
		}
		w.FP, w.FPOffset = rule.rule, rule.off
	default:
		w.FP = FPInvalid
	}
	return w.normal(), true
}

var (
	cfaText     = regexp.MustCompile(`^([a-z0-9]+)([+-][0-9]+)$`)
	entryHeader = regexp.MustCompile(`^([0-9a-f]{8,16}) ([0-9a-f]{8,16}) ([0-9a-f]{8,16}) (CIE|FDE)(.*)$`)
	cieInterp   = regexp.MustCompile(`^ "([^"]*)" cf=-?[0-9]+ df=-?[0-9]+ ra=([0-9]+)`)
	fdeText     = regexp.MustCompile(`^ cie=([0-9a-f]+) pc=([0-9a-f]+)\.\.([0-9a-f]+)`)
	regInCol    = regexp.MustCompile(`(r[0-9]+) (\([a-z0-9]+\))`)
	augLine     = regexp.MustCompile(`^\s+Augmentation:\s+"([^"]*)"`)
	raLine      = regexp.MustCompile(`^\s+Return address column:\s+([0-9]+)`)
	cfaExprLine = regexp.MustCompile(`DW_CFA_def_cfa_expression \((.*)\)$`)
	fpExprLine  = regexp.MustCompile(`DW_CFA_expression: r6 \(rbp\) \((.*)\)$`)
)

type readelfDump struct {
	entries map[uint64]*reEntry
	order   []*reEntry
}

// runReadelf runs readelf and parses its dump of one section, interpreted (-wF) or raw (-wf).
func runReadelf(t *testing.T, readelf, mode, path, section string) readelfDump {
	t.Helper()
	cmd := exec.Command(readelf, "-W", mode, path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	// readelf exits 1 without a message on some files (libc: its .gnu_debuglink target is
	// absent); the dump is complete nonetheless.
	if err != nil && (stderr.Len() > 0 || !bytes.Contains(out, []byte("Contents of the "))) {
		t.Fatalf("readelf %s %s: %v\n%s", mode, path, err, stderr.Bytes())
	}
	d := readelfDump{entries: map[uint64]*reEntry{}}
	var cur *reEntry
	var cols []string
	in := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "Contents of the ") {
			in = strings.HasPrefix(line, "Contents of the "+section+" section")
			cur = nil
			continue
		}
		if !in {
			continue
		}
		if m := entryHeader.FindStringSubmatch(line); m != nil {
			off, _ := strconv.ParseUint(m[1], 16, 64)
			cur = &reEntry{off: off, cie: m[4] == "CIE"}
			cols = nil
			if cur.cie {
				if cm := cieInterp.FindStringSubmatch(m[5]); cm != nil {
					cur.aug = cm[1]
					cur.raCol, _ = strconv.Atoi(cm[2])
				}
			} else {
				fm := fdeText.FindStringSubmatch(m[5])
				if fm == nil {
					t.Fatalf("readelf: cannot parse FDE header %q", line)
				}
				cur.cieOff, _ = strconv.ParseUint(fm[1], 16, 64)
				cur.start, _ = strconv.ParseUint(fm[2], 16, 64)
				cur.end, _ = strconv.ParseUint(fm[3], 16, 64)
			}
			d.entries[off] = cur
			d.order = append(d.order, cur)
			continue
		}
		if cur == nil {
			continue
		}
		if m := augLine.FindStringSubmatch(line); m != nil {
			cur.aug = m[1]
			continue
		}
		if m := raLine.FindStringSubmatch(line); m != nil {
			cur.raCol, _ = strconv.Atoi(m[1])
			continue
		}
		if m := cfaExprLine.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			cur.exprs = append(cur.exprs, m[1])
			continue
		}
		if m := fpExprLine.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			cur.fpExprs = append(cur.fpExprs, m[1])
			continue
		}
		fields := strings.Fields(regInCol.ReplaceAllString(line, "$1$2"))
		if len(fields) > 0 && fields[0] == "LOC" {
			cols = fields
			continue
		}
		if cols == nil || len(fields) != len(cols) || len(fields[0]) != 16 {
			continue
		}
		loc, err := strconv.ParseUint(fields[0], 16, 64)
		if err != nil {
			continue
		}
		row := reRow{loc: loc, cfa: fields[1]}
		for i, c := range cols {
			switch c {
			case "rbp":
				row.rbp = fields[i]
			case "ra":
				row.ra = fields[i]
			}
		}
		cur.rows = append(cur.rows, row)
	}
	if len(d.order) == 0 {
		t.Fatalf("readelf %s %s: no %s entries", mode, path, section)
	}
	return d
}
