package symbolize

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ianlancetaylor/demangle"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
	"github.com/sonde-profiler/sonde/symbolize/dwarf"
	"github.com/sonde-profiler/sonde/trace"
)

// frame is one frame as a tool prints it.
type frame struct {
	fn, file string
	line     int64
}

// binutilsAddr2line runs addr2line -a -f -i -C over vaddrs.
func binutilsAddr2line(t testing.TB, bin string, vaddrs []uint64) map[uint64][]frame {
	t.Helper()
	tool := testenv.RequireTool(t, "addr2line")
	args := []string{"-a", "-f", "-i", "-C", "-e", bin}
	for _, a := range vaddrs {
		args = append(args, fmt.Sprintf("%#x", a))
	}
	out, err := exec.Command(tool, args...).Output()
	if err != nil {
		t.Fatalf("addr2line: %v", err)
	}
	res := map[uint64][]frame{}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	var cur uint64
	for i := 0; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "0x") {
			cur = mustHex(t, lines[i])
			res[cur] = nil
			continue
		}
		if i+1 >= len(lines) {
			t.Fatalf("addr2line output ends after %q", lines[i])
		}
		fn, loc := lines[i], lines[i+1]
		i++
		if j := strings.Index(loc, " (discriminator"); j >= 0 {
			loc = loc[:j]
		}
		colon := strings.LastIndexByte(loc, ':')
		if colon < 0 {
			t.Fatalf("addr2line location %q", loc)
		}
		f := frame{fn: fn, file: loc[:colon]}
		f.line, _ = strconv.ParseInt(loc[colon+1:], 10, 64)
		if f.fn == "??" {
			f.fn = ""
		}
		if f.file == "??" {
			f.file = ""
		}
		res[cur] = append(res[cur], f)
	}
	return res
}

// wholeFile maps bin so that runtime address = base + file offset.
func wholeFile(t testing.TB, bin string, key objfile.Key) *trace.Mapping {
	t.Helper()
	st, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	const base = 0x7f00_0000_0000
	return &trace.Mapping{Start: base, End: base + uint64(st.Size()), Path: bin,
		File: objfile.HostFile(key, bin)}
}

// locationsAt returns leaf locations at the ELF virtual addresses vaddrs of m's file,
// converted to file offsets through readelf's program headers.
func locationsAt(t testing.TB, m *trace.Mapping, vaddrs []uint64) []*trace.Location {
	t.Helper()
	loads := readelfLoads(t, m.Path)
	locs := make([]*trace.Location, len(vaddrs))
	for i, a := range vaddrs {
		off, _ := fileOffsetOf(t, loads, a)
		locs[i] = &trace.Location{Kind: trace.FrameNative, Address: m.Start + off, Mapping: m}
	}
	return locs
}

func spreadText(t testing.TB, bin string, n int) []uint64 {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	text := f.Section(".text")
	if text == nil {
		t.Fatal("no .text")
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = text.Addr + uint64(i)*text.Size/uint64(n)
	}
	return out
}

// demangledAliases maps function addresses to the demangled names of every symbol there.
func demangledAliases(t testing.TB, bin string) map[uint64][]string {
	t.Helper()
	m := map[uint64][]string{}
	for _, s := range nmSymbols(t, bin) {
		if isText(s.typ) {
			m[s.addr] = append(m[s.addr], demangle.Filter(s.name))
		}
	}
	return m
}

// Names, files and lines of a C++ binary with inlining, built at -O2 -g, equal what
// binutils' addr2line -f -i -C prints, with the tolerances its lookup-order-dependent
// naming needs (see dwarf's compareFrames): the outermost frame may be named by the
// demangled DW_AT_name or by the symbol at the function's entry, and the innermost
// frame of inlined code by the symbol enclosing the address.
func TestSymbolizerMatchesAddr2line(t *testing.T) {
	bin := testprog.BuildCXX(t, append([]string{"-O2", "-g"}, pieArgs...)...)
	m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 10})
	vaddrs := spreadText(t, bin, 200)
	locs := locationsAt(t, m, vaddrs)
	want := binutilsAddr2line(t, bin, vaddrs)
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	dw, err := dwarf.Load(ef, dwarf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	aliases := demangledAliases(t, bin)

	s := New(Options{})
	if errs := s.Symbolize(&trace.Profile{Locations: locs}); len(errs) != 0 {
		t.Fatal(errs)
	}
	named, inlined, tolerated, padding := 0, 0, 0, 0
	for i, loc := range locs {
		a := vaddrs[i]
		w := want[a]
		if len(w) == 0 || w[0].fn == "" {
			if len(loc.Lines) != 0 {
				t.Errorf("%#x: %+v where addr2line knows nothing", a, loc.Lines)
			}
			continue
		}
		raw, err := dw.Lookup(a)
		if err != nil {
			t.Fatalf("%#x: %v", a, err)
		}
		if loc.NameSource != SourceDWARF {
			switch {
			case len(w) == 1 && len(loc.Lines) == 1 && loc.Lines[0].Function == w[0].fn:
				// addr2line names PLT stubs and crt code from the symbol table too.
			case len(loc.Lines) == 0 && (len(raw) == 0 || raw[0].Name == ""):
				// Padding past a function's end: binutils names it after the symbol
				// before it, sonde after nothing (see SymbolTable).
				padding++
			default:
				t.Errorf("%#x: source %q, lines %+v; addr2line %+v", a, loc.NameSource, loc.Lines, w)
			}
			continue
		}
		if len(loc.Lines) != len(w) || len(raw) != len(w) {
			t.Errorf("%#x: %d frames, addr2line %d:\n%+v\n%+v", a, len(loc.Lines), len(w), loc.Lines, w)
			continue
		}
		outer := raw[len(raw)-1]
		quirk := false
		for j, got := range loc.Lines {
			if got.Function != w[j].fn {
				switch {
				case j == len(w)-1 && w[j].fn == raw[j].Name:
				case j == 0 && len(w) > 1 && !raw[0].Linkage && slices.Contains(aliases[outer.Entry], w[0].fn):
				case j == len(w)-1 && slices.Contains(aliases[outer.Entry], w[j].fn):
				default:
					t.Errorf("%#x frame %d: function %q, addr2line %q", a, j, got.Function, w[j].fn)
				}
				quirk = true
			}
			if got.SystemName != got.Function && !strings.HasPrefix(got.SystemName, "_Z") {
				t.Errorf("%#x frame %d: system name %q for %q, want the mangled name", a, j, got.SystemName, got.Function)
			}
			gf, wf := path.Clean(got.File), path.Clean(w[j].file)
			if (gf != wf && !strings.HasSuffix(wf, "/"+gf)) || got.Line != w[j].line {
				t.Errorf("%#x frame %d: %s:%d, addr2line %s:%d", a, j, got.File, got.Line, w[j].file, w[j].line)
			}
		}
		named++
		if len(w) > 1 {
			inlined++
		}
		if quirk {
			tolerated++
		}
	}
	if named < 150 || inlined < 50 || tolerated > named/2 || padding > len(vaddrs)/20 {
		t.Errorf("%d of %d named from DWARF, %d inlined, %d by a tolerated naming", named, len(vaddrs), inlined, tolerated)
	}
	t.Logf("%d named from DWARF, %d inside inlined code, %d named as binutils does on another lookup order, %d in padding", named, inlined, tolerated, padding)
}

// Go binaries, stripped or not, are named from pclntab: the innermost file and line
// and the physical function equal what go tool addr2line prints, and inlined calls
// add frames.
func TestSymbolizerGo(t *testing.T) {
	full := testprog.BuildGo(t, testprog.GoInlining)
	strip := testenv.RequireTool(t, "strip")
	stripped := full + ".stripped"
	if out, err := exec.Command(strip, "-s", "-o", stripped, full).CombinedOutput(); err != nil {
		t.Fatalf("strip: %v\n%s", err, out)
	}
	for i, bin := range []string{full, testprog.BuildGo(t, testprog.GoInlining, "-ldflags=-s -w"), stripped} {
		t.Run(filepath.Base(bin)+strconv.Itoa(i), func(t *testing.T) {
			m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: uint64(20 + i)})
			m.File.IsGo = true
			vaddrs := spreadText(t, bin, 200)
			locs := locationsAt(t, m, vaddrs)
			want := testprog.GoAddr2line(t, bin, vaddrs)
			for _, mode := range []Mode{ModeFull, ModeSymtab} {
				for _, l := range locs {
					l.Lines, l.NameSource = nil, ""
				}
				s := New(Options{Mode: mode})
				if errs := s.Symbolize(&trace.Profile{Locations: locs}); len(errs) != 0 {
					t.Fatal(errs)
				}
				inlined := 0
				for j, loc := range locs {
					w := want[vaddrs[j]]
					if w.Func == "?" {
						continue
					}
					if loc.NameSource != SourceGopclntab || len(loc.Lines) == 0 {
						t.Errorf("%s %#x: %+v from %q, want %s", mode, vaddrs[j], loc.Lines, loc.NameSource, w.Func)
						continue
					}
					inner, outer := loc.Lines[0], loc.Lines[len(loc.Lines)-1]
					if outer.Function != w.Func || inner.File != w.File || inner.Line != w.Line {
						t.Errorf("%s %#x: %+v, want %s at %s:%d", mode, vaddrs[j], loc.Lines, w.Func, w.File, w.Line)
					}
					if len(loc.Lines) > 1 {
						inlined++
					}
				}
				if inlined < 10 {
					t.Errorf("%s: only %d of %d addresses inside inlined code", mode, inlined, len(vaddrs))
				}
			}
		})
	}
}
