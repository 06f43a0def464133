package gopclntab

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/symbolize/dwarf"
)

// goProgram inlines small functions and methods into a loop, as Go code does all over.
const goProgram = `package main

import (
	"fmt"
	"os"
	"sort"
	"strings"
)

type point struct{ x, y int }

func (p point) add(q point) point { return point{p.x + q.x, p.y + q.y} }
func sq(x int) int                 { return x * x }
func norm(p point) int             { return sq(p.x) + sq(p.y) }

//go:noinline
func work(n int) int {
	s := 0
	p := point{1, 2}
	for i := 0; i < n; i++ {
		p = p.add(point{i, -i})
		s += norm(p)
	}
	return s
}

func main() {
	words := strings.Fields(strings.Repeat("b a c ", len(os.Args)*10))
	sort.Strings(words)
	fmt.Println(work(len(words)), strings.Join(words[:3], ","))
}
`

// buildGo builds goProgram with the given go build flags.
func buildGo(t testing.TB, flags ...string) string {
	t.Helper()
	goTool := testenv.RequireTool(t, "go")
	dir := t.TempDir()
	for name, content := range map[string]string{
		"main.go": goProgram,
		"go.mod":  "module example.com/prog\n\ngo 1.22\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "prog")
	cmd := exec.Command(goTool, append(append([]string{"build", "-o", bin}, flags...), ".")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", flags, err, out)
	}
	return bin
}

func load(t testing.TB, bin string) (*elf.File, *Table) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tab, err := Load(f)
	if err != nil {
		t.Fatalf("Load(%s): %v", bin, err)
	}
	return f, tab
}

func spread(t testing.TB, f *elf.File, n int) []uint64 {
	t.Helper()
	text := f.Section(".text")
	if text == nil {
		t.Fatal("no .text")
	}
	addrs := make([]uint64, n)
	for i := range addrs {
		addrs[i] = text.Addr + uint64(i)*text.Size/uint64(n)
	}
	return addrs
}

type goLine struct {
	fn, file string
	line     int64
}

// goAddr2line asks go tool addr2line, which prints the physical function and the
// innermost file:line of each address.
func goAddr2line(t testing.TB, bin string, addrs []uint64) map[uint64]goLine {
	t.Helper()
	goTool := testenv.RequireTool(t, "go")
	var in bytes.Buffer
	for _, a := range addrs {
		fmt.Fprintf(&in, "%#x\n", a)
	}
	cmd := exec.Command(goTool, "tool", "addr2line", bin)
	cmd.Stdin = &in
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go tool addr2line: %v", err)
	}
	res := map[uint64]goLine{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for _, a := range addrs {
		if !sc.Scan() {
			t.Fatal("go tool addr2line: output ends early")
		}
		fn := sc.Text()
		if !sc.Scan() {
			t.Fatal("go tool addr2line: output ends early")
		}
		loc := sc.Text()
		colon := strings.LastIndexByte(loc, ':')
		n, err := strconv.ParseInt(loc[colon+1:], 10, 64)
		if colon < 0 || err != nil {
			t.Fatalf("go tool addr2line location %q", loc)
		}
		// Padding inside a function's extent has no line: ":-1" or "?:-1".
		file := loc[:colon]
		if n < 0 {
			file, n = "", 0
		}
		res[a] = goLine{fn: fn, file: file, line: n}
	}
	return res
}

func TestLookupMatchesGoAddr2line(t *testing.T) {
	full := buildGo(t)
	strippedByStrip := full + ".strip"
	strip := testenv.RequireTool(t, "strip")
	if out, err := exec.Command(strip, "-s", "-o", strippedByStrip, full).CombinedOutput(); err != nil {
		t.Fatalf("strip: %v\n%s", err, out)
	}
	for _, tc := range []struct{ name, bin string }{
		{"unstripped", full},
		{"ldflags-s-w", buildGo(t, "-ldflags=-s -w")},
		{"strip-s", strippedByStrip},
		{"pie", buildGo(t, "-buildmode=pie")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, tab := load(t, tc.bin)
			if tc.name != "unstripped" && tc.name != "pie" && f.Section(".symtab") != nil {
				t.Fatal("the stripped binary has .symtab")
			}
			if !tab.Inlining() {
				t.Error("no inline trees found")
			}
			addrs := spread(t, f, 200)
			want := goAddr2line(t, tc.bin, addrs)
			named, inlined := 0, 0
			for _, a := range addrs {
				got, w := tab.Lookup(a), want[a]
				if len(got) == 0 {
					if w.fn != "?" {
						t.Errorf("%#x: no frames, go tool addr2line says %+v", a, w)
					}
					continue
				}
				inner, outer := got[0], got[len(got)-1]
				if outer.Function != w.fn || inner.File != w.file || inner.Line != w.line {
					t.Errorf("%#x: %+v\nwant function %s at %s:%d", a, got, w.fn, w.file, w.line)
				}
				named++
				if len(got) > 1 {
					inlined++
				}
			}
			if named < len(addrs)*9/10 || inlined < 10 {
				t.Errorf("%d of %d addresses named, %d inlined", named, len(addrs), inlined)
			}
			t.Logf("%d named, %d inside inlined code", named, inlined)
		})
	}
}

// go tool addr2line shows one frame per address; the compiler's DWARF shows the
// whole inline chain, and the tables here must tell the same chain from pclntab.
func TestInlineChainMatchesDWARF(t *testing.T) {
	bin := buildGo(t)
	f, tab := load(t, bin)
	dw, err := dwarf.Load(f, 0)
	if err != nil {
		t.Fatal(err)
	}
	inlined, compared := 0, 0
	for _, a := range spread(t, f, 2000) {
		got, want := tab.Lookup(a), dw.Lookup(a)
		if len(want) == 0 || want[0].Name == "" {
			continue
		}
		compared++
		if len(got) != len(want) {
			t.Errorf("%#x: %+v\nDWARF %+v", a, got, want)
			continue
		}
		for i := range got {
			// The compiler's DWARF gives generated code no line; pclntab says <autogenerated>:1.
			if want[i].File == "" && got[i].File == "<autogenerated>" {
				want[i].File, want[i].Line = got[i].File, got[i].Line
			}
			if got[i].Function != want[i].Name || got[i].Line != want[i].Line || path.Clean(got[i].File) != path.Clean(want[i].File) {
				t.Errorf("%#x frame %d: %+v\nDWARF %+v", a, i, got, want)
				break
			}
		}
		if len(got) > 1 {
			inlined++
		}
	}
	if compared < 1000 || inlined < 100 {
		t.Errorf("compared %d addresses, %d inlined; too few to tell", compared, inlined)
	}
	t.Logf("%d addresses compared, %d inside inlined code", compared, inlined)

	// The test's own code: work's loop inlines add, norm and sq.
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range syms {
		if s.Name != "main.work" {
			continue
		}
		for a := s.Value; a < s.Value+s.Size; a++ {
			frames := tab.Lookup(a)
			if len(frames) > 1 && frames[len(frames)-1].Function == "main.work" {
				seen[frames[0].Function] = true
			}
		}
	}
	for _, fn := range []string{"main.point.add", "main.sq"} {
		if !seen[fn] {
			t.Errorf("no address of main.work is inside inlined %s; saw %v", fn, seen)
		}
	}
}
