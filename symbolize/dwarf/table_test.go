package dwarf

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
)

// addr2line runs binutils' addr2line -a -f -i over addrs and returns the frames of
// each, innermost first.
func addr2line(t testing.TB, bin string, demangle bool, addrs []uint64) map[uint64][]Frame {
	t.Helper()
	tool := testenv.RequireTool(t, "addr2line")
	args := []string{"-a", "-f", "-i", "-e", bin}
	if demangle {
		args = append(args, "-C")
	}
	for _, a := range addrs {
		args = append(args, fmt.Sprintf("%#x", a))
	}
	out, err := exec.Command(tool, args...).Output()
	if err != nil {
		t.Fatalf("addr2line: %v", err)
	}
	return parseAddr2line(t, string(out))
}

// parseAddr2line reads "0xADDR" lines, each followed by function and file:line pairs.
func parseAddr2line(t testing.TB, out string) map[uint64][]Frame {
	t.Helper()
	res := map[uint64][]Frame{}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	var cur uint64
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(l, "0x") {
			v, err := strconv.ParseUint(l[2:], 16, 64)
			if err != nil {
				t.Fatalf("addr2line address %q: %v", l, err)
			}
			cur = v
			res[cur] = nil
			continue
		}
		if i+1 >= len(lines) {
			t.Fatalf("addr2line output ends after function %q", l)
		}
		i++
		res[cur] = append(res[cur], Frame{Name: l, File: "", Line: 0})
		f := &res[cur][len(res[cur])-1]
		loc := lines[i]
		if j := strings.Index(loc, " (discriminator"); j >= 0 {
			loc = loc[:j]
		}
		colon := strings.LastIndexByte(loc, ':')
		if colon < 0 {
			t.Fatalf("addr2line location %q", loc)
		}
		f.File = loc[:colon]
		if n, err := strconv.ParseInt(loc[colon+1:], 10, 64); err == nil {
			f.Line = n
		}
		if f.Name == "??" {
			f.Name = ""
		}
		if f.File == "??" {
			f.File = ""
		}
	}
	return res
}

// loadFile loads bin's DWARF from a mapping of it, as the symbolizer does.
func loadFile(t testing.TB, bin string) (*elf.File, *Table) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	osf, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer osf.Close()
	m, err := mmapfile.Map(osf)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := Load(f, Options{File: m.Bytes()})
	if err != nil {
		t.Fatalf("Load(%s): %v", bin, err)
	}
	t.Cleanup(func() {
		tab.Close()
		m.Close()
	})
	return f, tab
}

// lookup looks addr up in tab, failing the test on an error.
func lookup(t testing.TB, tab *Table, addr uint64) []Frame {
	t.Helper()
	frames, err := tab.Lookup(addr)
	if err != nil {
		t.Fatalf("Lookup(%#x): %v", addr, err)
	}
	return frames
}

// spread returns n addresses spread evenly over the section.
func spread(t testing.TB, f *elf.File, name string, n int) []uint64 {
	t.Helper()
	s := f.Section(name)
	if s == nil {
		t.Fatalf("no %s", name)
	}
	addrs := make([]uint64, n)
	for i := range addrs {
		addrs[i] = s.Addr + uint64(i)*s.Size/uint64(n)
	}
	return addrs
}

// symbolNames maps function addresses to their ELF symbol names, aliases included.
func symbolNames(t testing.TB, f *elf.File) map[uint64][]string {
	t.Helper()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	m := map[uint64][]string{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 {
			m[s.Value] = append(m[s.Value], s.Name)
		}
	}
	for _, names := range m {
		slices.Sort(names)
	}
	return m
}

// compareFrames reports how got differs from addr2line's want, or "" when they agree.
//
// binutils' names depend on the order it is asked in (dwarf2.c remembers per function
// that it searched the symbol table): a function whose DWARF name is not a linkage
// name is named after the symbol table the first time, after DWARF later, and the
// innermost function of an address after the symbol enclosing it, which for inlined
// code is its outermost caller. So a name also agrees when it is the plain DWARF name
// while binutils gave a symbol at the function's entry, or the other way round; the
// symbol may be any alias at that address. quirk reports such an agreement.
//
// strictFiles compares paths after cleaning, also accepting binutils' doubling of a
// relative compilation directory ("./csu/./csu/x.c" for csu/x.c); otherwise files are
// not compared, for binutils 2.40 takes DWARF 5 file 0 for file 1 in some units of
// libc (it reports stdlib/strfromd.c:117 where readelf's decoded line table and this
// table say strfrom-skeleton.c:117).
func compareFrames(got, want []Frame, symbols map[uint64][]string, strictFiles bool) (diff string, quirk bool) {
	if len(got) != len(want) {
		return fmt.Sprintf("%d frames, want %d", len(got), len(want)), false
	}
	outer := got[len(got)-1]
	for i := range got {
		g, w := got[i], want[i]
		if g.Name != w.Name {
			switch {
			case i == len(got)-1 && !g.Linkage && slices.Contains(symbols[g.Entry], w.Name):
			case i == 0 && !g.Linkage && slices.Contains(symbols[outer.Entry], w.Name):
			default:
				return fmt.Sprintf("frame %d: name %q, want %q", i, g.Name, w.Name), false
			}
			quirk = true
		}
		gf, wf := path.Clean(g.File), path.Clean(w.File)
		if strictFiles && gf != wf && !strings.HasSuffix(wf, "/"+gf) {
			return fmt.Sprintf("frame %d: file %s, want %s", i, g.File, w.File), false
		}
		if g.Line != w.Line {
			return fmt.Sprintf("frame %d: line %d, want %d", i, g.Line, w.Line), false
		}
	}
	return "", quirk
}

func TestLookupMatchesAddr2line(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"dwarf5", []string{"-O2", "-g"}},
		{"dwarf4-compressed", []string{"-O2", "-gdwarf-4", "-gz"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := testprog.BuildCXX(t, tc.flags...)
			f, tab := loadFile(t, bin)
			addrs := spread(t, f, ".text", 200)
			want := addr2line(t, bin, false, addrs)
			symbols := symbolNames(t, f)
			inlined, named, quirks := 0, 0, 0
			for _, a := range addrs {
				got := lookup(t, tab, a)
				// addr2line names from the symbol table what DWARF leaves unnamed (the
				// PLT, crt code); the table answers from DWARF alone.
				if len(got) == 0 || got[0].Name == "" {
					continue
				}
				diff, quirk := compareFrames(got, want[a], symbols, true)
				if diff != "" {
					t.Errorf("%#x: %s\ngot  %+v\nwant %+v", a, diff, got, want[a])
					continue
				}
				named++
				if quirk {
					quirks++
				}
				if len(got) > 1 {
					inlined++
				}
			}
			if quirks > named/2 {
				t.Errorf("%d of %d addresses named differently than by binutils; too many to be its lookup-order quirk", quirks, named)
			}
			if named < len(addrs)*3/4 {
				t.Errorf("only %d of %d addresses named from DWARF", named, len(addrs))
			}
			if inlined < 20 {
				t.Errorf("only %d of %d addresses inside inlined code; the sample does not exercise inlining", inlined, len(addrs))
			}
			t.Logf("%d addresses named, %d inside inlined code, %d named as binutils does on another lookup order", named, inlined, quirks)
		})
	}
}

// libcPath is the C library of Debian's x86-64 and arm64 multiarch layouts.
func libcPath(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/aarch64-linux-gnu/libc.so.6"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	testenv.Unavailable(t, "no libc.so.6 in a Debian multiarch directory")
	return ""
}

// buildIDDebugFile returns where Debian's -dbgsym packages put the debug file of lib.
func buildIDDebugFile(t testing.TB, lib string) string {
	t.Helper()
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := f.Section(".note.gnu.build-id")
	if s == nil {
		t.Fatalf("%s has no build id", lib)
	}
	data, err := s.Data()
	if err != nil || len(data) < 16 {
		t.Fatalf("build id note of %s: %v", lib, err)
	}
	id := fmt.Sprintf("%x", data[16:])
	p := filepath.Join("/usr/lib/debug/.build-id", id[:2], id[2:]+".debug")
	if _, err := os.Stat(p); err != nil {
		testenv.Unavailable(t, "no debug file for %s (apt-get install libc6-dbg): %v", lib, err)
	}
	return p
}

// The C library's separate, compressed DWARF 5, as Debian ships it in libc6-dbg: the
// assembly string functions, IFUNC variants and inlined headers of real code.
func TestLookupMatchesAddr2lineLibc(t *testing.T) {
	lib := libcPath(t)
	debug := buildIDDebugFile(t, lib)
	f, tab := loadFile(t, debug)
	lf, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	addrs := spread(t, lf, ".text", 200)
	want := addr2line(t, lib, false, addrs)
	symbols := symbolNames(t, f)
	named, inlined := 0, 0
	for _, a := range addrs {
		got := lookup(t, tab, a)
		if len(got) == 0 || got[0].Name == "" {
			continue
		}
		if diff, _ := compareFrames(got, want[a], symbols, false); diff != "" {
			t.Errorf("%#x: %s\ngot  %+v\nwant %+v", a, diff, got, want[a])
			continue
		}
		named++
		if len(got) > 1 {
			inlined++
		}
	}
	if named < len(addrs)/2 || inlined == 0 {
		t.Errorf("%d of %d addresses named from DWARF, %d inlined; libc6-dbg should cover most", named, len(addrs), inlined)
	}
	t.Logf("%d addresses named, %d inside inlined code", named, inlined)
}

// A file truncated under its mapping: decoding a unit faults, and the lookup returns
// the fault as an error instead of taking the process down.
func TestLookupTruncatedWhileMapped(t *testing.T) {
	bin := buildC(t, "-O2", "-g")
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, data, 0o755); err != nil {
		t.Fatal(err)
	}
	_, tab := loadFile(t, victim)
	if len(tab.spans) == 0 {
		t.Fatal("no unit indexed")
	}
	addr := tab.spans[0].lo
	if err := os.Truncate(victim, 4096); err != nil {
		t.Fatal(err)
	}
	var lookupErr error
	if err := mmapfile.Guard(func() { _, lookupErr = tab.Lookup(addr) }); err != nil {
		t.Fatalf("the fault escaped Lookup: %v", err)
	}
	if !errors.Is(lookupErr, mmapfile.ErrFault) {
		t.Fatalf("Lookup of a truncated file: %v, want a fault", lookupErr)
	}
}

// ltoProgram inlines across files under -flto: GCC puts the code in an artificial
// unit whose inlined calls and functions name their abstract origins in the units
// of the sources, by DW_FORM_ref_addr.
var ltoProgram = map[string]string{
	"a.c": `int leafy(int x);
int mix(int a, int b);
static int acc;
__attribute__((noinline)) int outer(int n) { for (int i = 0; i < n; i++) acc += mix(i, n) + leafy(i); return acc; }
int main(int argc, char **argv) { (void)argv; return outer(argc * 1000) & 0xff; }
`,
	"b.c": `int leafy(int x) { return x * 7 + (x >> 3); }
int mix(int a, int b) { return leafy(a) ^ (b * 31); }
`,
}

// Names that lie in other units are found there: a unit decoded alone follows its
// references into the units that hold them, and names what binutils names.
func TestLookupCrossUnitReferences(t *testing.T) {
	gcc := testenv.RequireTool(t, "gcc")
	dir := t.TempDir()
	args := []string{"-O2", "-g", "-flto", "-o", filepath.Join(dir, "prog")}
	for name, src := range ltoProgram {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, filepath.Join(dir, name))
	}
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %v: %v\n%s", args, err, out)
	}
	bin := filepath.Join(dir, "prog")
	f, tab := loadFile(t, bin)
	if len(tab.units) < 2 {
		t.Fatalf("%d units; LTO should leave the artificial one and the sources'", len(tab.units))
	}
	addrs := spread(t, f, ".text", 400)
	want := addr2line(t, bin, false, addrs)
	symbols := symbolNames(t, f)
	inlined := map[string]bool{}
	for _, a := range addrs {
		got := lookup(t, tab, a)
		if len(got) == 0 || got[0].Name == "" {
			continue
		}
		if diff, _ := compareFrames(got, want[a], symbols, false); diff != "" {
			t.Errorf("%#x: %s\ngot  %+v\nwant %+v", a, diff, got, want[a])
		}
		for _, fr := range got[:len(got)-1] {
			inlined[fr.Name] = true
		}
	}
	if !inlined["mix"] || !inlined["leafy"] {
		t.Errorf("inlined frames named %v; want mix and leafy, whose names are in b.c's unit", inlined)
	}
}
