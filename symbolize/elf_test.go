package symbolize

import (
	"bytes"
	"cmp"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
)

// testProgram has static and exported functions, a global and a weak alias, and calls
// them all so that none is dropped.
const testProgram = `
#include <stdio.h>
__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }
__attribute__((noinline)) static int helper(int x) { return leaf(x) ^ 0x55; }
__attribute__((noinline)) int exported_fn(int x) { return helper(x) + 7; }
int leaf_alias(int x) __attribute__((alias("leaf")));
int ef(int x) __attribute__((weak, alias("exported_fn")));
int main(int argc, char **argv) {
	printf("%d %d %d\n", exported_fn(argc), leaf_alias(argc), ef(argc));
	return 0;
}
`

// buildC compiles src into a temporary directory. The functions are aligned so that
// sized functions are followed by padding no symbol covers.
func buildC(t testing.TB, src string, args ...string) string {
	t.Helper()
	gcc := testenv.RequireTool(t, "gcc")
	dir := t.TempDir()
	in := filepath.Join(dir, "prog.c")
	out := filepath.Join(dir, "prog")
	if err := os.WriteFile(in, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cmdArgs := append([]string{"-O1", "-g", "-fno-omit-frame-pointer", "-falign-functions=32", "-o", out, in}, args...)
	if b, err := exec.Command(gcc, cmdArgs...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(cmdArgs, " "), err, b)
	}
	return out
}

type nmSym struct {
	addr, size uint64
	sized      bool
	typ        byte
	name       string
}

// nmSymbols lists the defined symbols of path as nm sees them.
func nmSymbols(t testing.TB, path string, args ...string) []nmSym {
	t.Helper()
	nm := testenv.RequireTool(t, "nm")
	cmdArgs := append([]string{"--defined-only", "-S"}, args...)
	out, err := exec.Command(nm, append(cmdArgs, path)...).Output()
	if err != nil {
		t.Fatalf("nm %s: %v", path, err)
	}
	var syms []nmSym
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		var s nmSym
		switch len(f) {
		case 3:
			s.typ, s.name = f[1][0], f[2]
		case 4:
			s.typ, s.name, s.sized = f[2][0], f[3], true
			s.size = mustHex(t, f[1])
		default:
			continue
		}
		s.addr = mustHex(t, f[0])
		syms = append(syms, s)
	}
	return syms
}

func mustHex(t testing.TB, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 64)
	if err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	return v
}

func isText(typ byte) bool { return strings.IndexByte("TtWi", typ) >= 0 }

func nmRank(typ byte) int {
	switch typ {
	case 'T', 'i':
		return 0
	case 'W':
		return 1
	default:
		return 2
	}
}

func readELFFile(t testing.TB, path string) *ELFSymbols {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := ReadELF(f)
	if err != nil {
		t.Fatalf("ReadELF(%s): %v", path, err)
	}
	return syms
}

func TestELFLookupMatchesNm(t *testing.T) {
	bin := buildC(t, testProgram)
	syms := readELFFile(t, bin)

	// nm lists every alias; the table keeps one per address, chosen as documented.
	want := map[uint64]nmSym{}
	for _, s := range nmSymbols(t, bin) {
		if !isText(s.typ) {
			continue
		}
		if w, ok := want[s.addr]; !ok || preferAlias(nmRank(s.typ), nmRank(w.typ), s.name, w.name) < 0 {
			want[s.addr] = s
		}
	}
	for _, name := range []string{"leaf", "helper", "exported_fn", "main"} {
		if !slices.ContainsFunc(mapValues(want), func(s nmSym) bool { return s.name == name }) {
			t.Errorf("nm does not list %s as the name of its address", name)
		}
	}
	for _, s := range nmSymbols(t, bin) {
		if s.typ != 'T' && s.typ != 't' {
			continue
		}
		got, ok := syms.Funcs.Lookup(s.addr + 1)
		if !ok || got.Name != want[s.addr].name {
			t.Errorf("Lookup(%s+1 = %#x) = %q, %v; want %q", s.name, s.addr+1, got.Name, ok, want[s.addr].name)
		}
	}
}

func mapValues[K comparable, V any](m map[K]V) []V {
	var vs []V
	for _, v := range m {
		vs = append(vs, v)
	}
	return vs
}

func TestELFAddressPastSizedFunction(t *testing.T) {
	bin := buildC(t, testProgram)
	syms := readELFFile(t, bin)
	var text []nmSym
	for _, s := range nmSymbols(t, bin) {
		if isText(s.typ) {
			text = append(text, s)
		}
	}
	slices.SortFunc(text, func(a, b nmSym) int { return cmp.Compare(a.addr, b.addr) })
	checked := 0
	for i, s := range text[:len(text)-1] {
		if !s.sized || s.size == 0 || s.addr+s.size >= text[i+1].addr {
			continue
		}
		if got, ok := syms.Funcs.Lookup(s.addr + s.size - 1); !ok || got.Value != s.addr {
			t.Errorf("Lookup(last byte of %s) = %q, %v", s.name, got.Name, ok)
		}
		if got, ok := syms.Funcs.Lookup(s.addr + s.size); ok {
			t.Errorf("Lookup(end of %s at %#x) = %q, want no symbol: the padding after it is not it", s.name, s.addr+s.size, got.Name)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no sized function followed by a gap; the test checked nothing")
	}
}

func TestELFStrippedUsesDynsym(t *testing.T) {
	strip := testenv.RequireTool(t, "strip")
	lib := buildC(t, testProgram, "-shared", "-fPIC")
	stripped := lib + ".stripped"
	if b, err := exec.Command(strip, "-s", "-o", stripped, lib).CombinedOutput(); err != nil {
		t.Fatalf("strip: %v\n%s", err, b)
	}
	f, err := elf.Open(stripped)
	if err != nil {
		t.Fatal(err)
	}
	if f.Section(".symtab") != nil {
		t.Fatal("strip -s left .symtab")
	}
	f.Close()

	syms := readELFFile(t, stripped)
	found := false
	for _, s := range nmSymbols(t, stripped, "-D") {
		if s.name != "exported_fn" {
			continue
		}
		found = true
		if got, ok := syms.Funcs.Lookup(s.addr + 1); !ok || got.Name != "exported_fn" {
			t.Errorf("Lookup(exported_fn+1) = %q, %v", got.Name, ok)
		}
	}
	if !found {
		t.Fatal("nm -D does not list exported_fn")
	}
}

type loadHeader struct{ off, vaddr, filesz uint64 }

// readelfLoads lists PT_LOAD headers as readelf sees them, independently of debug/elf.
func readelfLoads(t testing.TB, path string) []loadHeader {
	t.Helper()
	readelf := testenv.RequireTool(t, "readelf")
	out, err := exec.Command(readelf, "-lW", path).Output()
	if err != nil {
		t.Fatalf("readelf -lW %s: %v", path, err)
	}
	var loads []loadHeader
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) < 6 || f[0] != "LOAD" {
			continue
		}
		loads = append(loads, loadHeader{off: mustHex(t, f[1]), vaddr: mustHex(t, f[2]), filesz: mustHex(t, f[4])})
	}
	if len(loads) == 0 {
		t.Fatalf("readelf lists no LOAD segment in %s", path)
	}
	return loads
}

// fileOffsetOf converts a virtual address to a file offset the way the loader maps it.
func fileOffsetOf(t testing.TB, loads []loadHeader, vaddr uint64) (off uint64, seg loadHeader) {
	t.Helper()
	for _, l := range loads {
		if vaddr >= l.vaddr && vaddr < l.vaddr+l.filesz {
			return vaddr - l.vaddr + l.off, l
		}
	}
	t.Fatalf("no LOAD segment holds %#x", vaddr)
	return 0, loadHeader{}
}

// pieArgs build a position-independent executable whose text does not sit at the
// same file offset and virtual address, as lld and gold often lay files out; GNU ld's
// default layout would make the conversion an identity and the test vacuous.
var pieArgs = []string{"-pie", "-fPIE", "-Wl,--section-start=.text=0x3000"}

func TestELFFileOffsetPIE(t *testing.T) {
	bin := buildC(t, testProgram, pieArgs...)
	if f, err := elf.Open(bin); err != nil {
		t.Fatal(err)
	} else if f.Type != elf.ET_DYN {
		t.Fatalf("type %v, want a PIE (ET_DYN)", f.Type)
	}
	syms := readELFFile(t, bin)
	loads := readelfLoads(t, bin)
	for _, s := range nmSymbols(t, bin) {
		if s.name != "exported_fn" && s.name != "helper" {
			continue
		}
		off, _ := fileOffsetOf(t, loads, s.addr)
		if off == s.addr {
			t.Errorf("%s: file offset equals address %#x; the layout does not exercise conversion", s.name, off)
		}
		if got, ok := syms.Vaddr(off); !ok || got != s.addr {
			t.Errorf("Vaddr(%#x) = %#x, %v; want %#x", off, got, ok, s.addr)
		}
		if got, ok := syms.LookupFileOffset(off + 2); !ok || got.Name != s.name {
			t.Errorf("LookupFileOffset(%s+2) = %q, %v", s.name, got.Name, ok)
		}
	}
	if _, ok := syms.Vaddr(1 << 40); ok {
		t.Error("Vaddr of an offset past the file succeeded")
	}
}

func TestReadELFCorrupt(t *testing.T) {
	bin := buildC(t, testProgram)
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 4, 16, 63, 64, 1000, len(data) / 2, len(data) - 1} {
		if _, err := ReadELF(bytes.NewReader(data[:n])); err == nil {
			t.Errorf("ReadELF of the first %d of %d bytes succeeded", n, len(data))
		}
	}
	if _, err := ReadELF(strings.NewReader("not an ELF file at all, just text")); err == nil {
		t.Error("ReadELF of text succeeded")
	}
	// Point the section headers past the end of the file.
	bad := bytes.Clone(data)
	copy(bad[0x28:0x30], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	if _, err := ReadELF(bytes.NewReader(bad)); err == nil {
		t.Error("ReadELF with e_shoff past the end succeeded")
	}
}

func FuzzELFTable(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	// The seeds that matter are real files; without gcc the fuzzer starts from less.
	if _, err := exec.LookPath("gcc"); err == nil {
		bin := buildC(f, testProgram)
		data, err := os.ReadFile(bin)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data[:min(len(data), 4096)])
		f.Add(data[:len(data)/2])
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		syms, err := ReadELF(bytes.NewReader(data))
		if err != nil {
			return
		}
		for _, off := range []uint64{0, 1, 0x1000, uint64(len(data)), 1<<64 - 1} {
			syms.LookupFileOffset(off)
			syms.Funcs.Lookup(off)
		}
		for i := range syms.Funcs.Len() {
			s := syms.Funcs.symbol(i)
			if got, ok := syms.Funcs.Lookup(s.Value); ok && got.Value != s.Value {
				t.Fatalf("Lookup(%#x) found the symbol at %#x", s.Value, got.Value)
			}
		}
	})
}

// elf32 converts bin to an ELF32 file (x32), whose symbols are Elf32_Sym. objcopy
// does not convert the dynamic sections' entries, so they are left out.
func elf32(t testing.TB, bin string) string {
	t.Helper()
	out := bin + ".elf32"
	objcopy := testenv.RequireTool(t, "objcopy")
	args := []string{"-O", "elf32-x86-64"}
	for _, s := range []string{".dynsym", ".dynstr", ".gnu.version", ".gnu.version_r", ".gnu.hash", ".rela.dyn", ".rela.plt", ".dynamic"} {
		args = append(args, "-R", s)
	}
	if b, err := exec.Command(objcopy, append(args, bin, out)...).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v\n%s", err, b)
	}
	return out
}

// inPlace builds the symbol table of the ELF file data as from a mapping of it: the
// names stay in data.
func inPlace(t testing.TB, data []byte) (*SymbolTable, error) {
	t.Helper()
	f, err := objfile.NewELF(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	var sr symbolReader
	if err := sr.read(f, data, nil, true); err != nil {
		return nil, err
	}
	return sr.table(nil), nil
}

// A table read in place from the file's bytes names every address as the one read
// through debug/elf does, and copies no names.
func TestSymbolTableInPlaceMatchesRead(t *testing.T) {
	bins := []string{buildC(t, testProgram), elf32(t, buildC(t, testProgram))}
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/libc.so.6"); err == nil {
		bins = append(bins, "/usr/lib/x86_64-linux-gnu/libc.so.6")
	}
	for _, bin := range bins {
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		mapped, err := inPlace(t, data)
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		read := readELFFile(t, bin).Funcs
		if mapped.Len() != read.Len() || mapped.Len() == 0 {
			t.Fatalf("%s: %d symbols in place, %d read", bin, mapped.Len(), read.Len())
		}
		if len(mapped.names[0]) != 0 || len(read.names) != 1 {
			t.Errorf("%s: the table read in place copied %d bytes of names", bin, len(mapped.names[0]))
		}
		for i := range read.Len() {
			if got, want := mapped.symbol(i), read.symbol(i); got != want {
				t.Fatalf("%s: symbol %d in place %+v, read %+v", bin, i, got, want)
			}
		}
	}
}

// FuzzELFTableInPlace feeds whole ELF files to the symbol table reader as if mapped:
// every offset and size read from them is checked against the file's bytes.
func FuzzELFTableInPlace(f *testing.F) {
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	if _, err := exec.LookPath("gcc"); err == nil {
		bin := buildC(f, testProgram)
		for _, p := range []string{bin, elf32(f, bin)} {
			data, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, err := inPlace(t, data)
		if err != nil {
			return
		}
		for i := range tab.Len() {
			s := tab.symbol(i)
			if got, ok := tab.Lookup(s.Value); !ok || got.Value != s.Value || got.Name != s.Name {
				t.Fatalf("Lookup(%#x) = %+v, %v; want %+v", s.Value, got, ok, s)
			}
		}
	})
}
