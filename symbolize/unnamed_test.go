package symbolize

import (
	"bufio"
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/trace"
)

// pltProgram calls libc through its PLT, one function also by address (.plt.got).
const pltProgram = `
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int (*cmp)(const char *, const char *) = strcmp;
int main(int argc, char **argv) {
	char buf[64];
	memcpy(buf, argv[0], 8);
	buf[8] = 0;
	printf("%zu %d %p\n", strlen(buf), cmp(buf, argv[0]), (void *)malloc(16));
	return 0;
}
`

// objdumpLabels lists the addresses objdump -d labels in the named sections.
func objdumpLabels(t *testing.T, path string, sections ...string) map[uint64]string {
	t.Helper()
	objdump := testenv.RequireTool(t, "objdump")
	args := []string{"-d", "-w"}
	for _, s := range sections {
		args = append(args, "-j", s)
	}
	out, err := exec.Command(objdump, append(args, path)...).Output()
	if err != nil {
		t.Fatalf("objdump %s: %v", path, err)
	}
	label := regexp.MustCompile(`^([0-9a-f]+) <(.+)>:$`)
	got := map[uint64]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := label.FindStringSubmatch(sc.Text()); m != nil {
			addr, _ := strconv.ParseUint(m[1], 16, 64)
			got[addr] = m[2]
		}
	}
	return got
}

// PLT entries are named as objdump names them, from the first byte of an entry to its last.
func TestPLTNamesMatchObjdump(t *testing.T) {
	files := map[string]string{
		"pie":         buildC(t, pltProgram, "-fPIE", "-pie"),
		"nopie":       buildC(t, pltProgram, "-no-pie"),
		"lazy no ibt": buildC(t, pltProgram, "-fcf-protection=none", "-Wl,-z,lazy"),
		"now ibt":     buildC(t, pltProgram, "-fcf-protection=full", "-Wl,-z,now"),
		"libc":        "/usr/lib/x86_64-linux-gnu/libc.so.6",
		"libstdc++":   "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
	}
	for name, path := range files {
		t.Run(name, func(t *testing.T) {
			requireFileAt(t, path)
			labels := objdumpLabels(t, path, ".plt", ".plt.sec", ".plt.got")
			f, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			u := readUnnamed(f, path)
			n := 0
			for addr, want := range labels {
				if !regexp.MustCompile(`@plt$`).MatchString(want) {
					continue
				}
				n++
				for _, at := range []uint64{addr, addr + 7} {
					lines, src := u.lookup(at)
					if len(lines) != 1 || lines[0].Function != want || src != SourcePLT {
						t.Errorf("%#x: %+v from %q, objdump says %s", at, lines, src, want)
					}
				}
			}
			if n == 0 {
				t.Fatalf("objdump named no PLT entry of %s", path)
			}
			t.Logf("%d PLT entries named as objdump names them", n)
		})
	}
}

// A static binary's ifuncs are called through a PLT of 8-byte entries, which objdump
// leaves unnamed: each is named after its ifunc's resolver, as objdump names a shared
// library's.
func TestPLTStaticIfuncs(t *testing.T) {
	path := buildC(t, pltProgram, "-static")
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := f.Section(".plt")
	if s == nil {
		testenv.Unavailable(t, "no .plt in a static binary")
	}
	u := readUnnamed(f, path)
	names := map[string]bool{}
	for at := s.Addr; at < s.Addr+s.Size; at += 8 {
		lines, src := u.lookup(at)
		if len(lines) != 1 || src != SourcePLT || !regexp.MustCompile(`^\*ABS\*\+0x[0-9a-f]+@plt$`).MatchString(lines[0].Function) {
			t.Fatalf("%#x: %+v from %q", at, lines, src)
		}
		names[lines[0].Function] = true
	}
	if len(names) != int(s.Size/8) {
		t.Errorf("%d names for %d entries", len(names), s.Size/8)
	}
}

func requireFileAt(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		testenv.Unavailable(t, "needs %s: %v", path, err)
	}
}

// stripped is a program whose functions are static: once stripped, no symbol names them.
const stripped = `
#include <stdio.h>
#define KEEP __attribute__((noinline))
static volatile long acc;
KEEP static long one(long x) { for (int i = 0; i < 3; i++) acc += x * i; return acc; }
KEEP static long two(long x) { return one(x) + one(x + 1); }
KEEP static long three(long x) { return two(x) * 3 + one(x); }
int main(int argc, char **argv) { printf("%ld\n", three(argc)); return 0; }
`

// In a stripped object every function is named after the FDE that covers it, which starts
// where objdump, reading the unstripped file, puts the function's symbol: one name per
// function however many addresses of it are sampled, none shared by two functions.
func TestFDENamesMatchObjdump(t *testing.T) {
	strip := testenv.RequireTool(t, "strip")
	full := buildC(t, stripped, "-O2", "-fomit-frame-pointer")
	bare := filepath.Join(t.TempDir(), "bare")
	if out, err := exec.Command(strip, "-s", "-o", bare, full).CombinedOutput(); err != nil {
		t.Fatalf("strip: %v\n%s", err, out)
	}
	labels := objdumpLabels(t, full, ".text")
	f, err := elf.Open(bare)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := readUnnamed(f, bare)
	if u == nil {
		t.Fatal("nothing names the stripped program's code")
	}
	seen := map[string]string{}
	for addr, fn := range labels {
		switch fn {
		case "one", "two", "three", "main":
		default:
			continue // crt's code, which has no FDE of its own
		}
		want := "bare+0x" + strconv.FormatUint(addr, 16)
		for _, at := range []uint64{addr, addr + 3} {
			lines, src := u.lookup(at)
			if len(lines) != 1 || lines[0].Function != want || src != SourceFDE {
				t.Errorf("%s at %#x: %+v from %q, want %s", fn, at, lines, src, want)
			}
		}
		if other, dup := seen[want]; dup {
			t.Errorf("%s and %s share the name %s", fn, other, want)
		}
		seen[want] = fn
	}
	if len(seen) != 4 {
		t.Errorf("named %d of the program's 4 functions: %v", len(seen), seen)
	}

	// Through the symbolizer: the name, its source, and the same name for every address
	// of the function.
	s := New(Options{DebugDirs: []string{}})
	file := objfile.HostFile(objfile.Key{Dev: 9, Inode: 9}, bare)
	var textOff uint64
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			textOff = p.Off - p.Vaddr
		}
	}
	m := &trace.Mapping{Start: 0x10000, End: 0x10000 + 0x100000, Offset: 0, File: file, Path: bare}
	var locs []*trace.Location
	for addr := range labels {
		if labels[addr] == "three" {
			for d := uint64(0); d < 8; d += 4 {
				locs = append(locs, &trace.Location{Kind: trace.FrameNative, Address: m.Start + addr + d + textOff, Mapping: m})
			}
		}
	}
	p := &trace.Profile{Locations: locs, Samples: []*trace.Sample{{Locations: locs[:1], Count: 1}, {Locations: locs[1:], Count: 1}}}
	if errs := s.Symbolize(p); len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, l := range locs {
		if len(l.Lines) != 1 || l.NameSource != SourceFDE || l.Lines[0].Function != locs[0].Lines[0].Function {
			t.Errorf("%#x: %+v from %q", l.Address, l.Lines, l.NameSource)
		}
	}
}

// FuzzUnnamed reads PLT entries and FDE names from hostile files: bounded, and never a
// panic.
func FuzzUnnamed(f *testing.F) {
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	if _, err := exec.LookPath("gcc"); err == nil {
		for _, flags := range [][]string{{"-fPIE", "-pie"}, {"-static"}} {
			data, err := os.ReadFile(buildC(f, pltProgram, flags...))
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ef, err := objfile.NewELF(bytes.NewReader(data))
		if err != nil {
			return
		}
		u := readUnnamed(ef, "fuzz")
		if u == nil {
			return
		}
		for i, e := range u.plt {
			if e.end <= e.start || (i > 0 && e.start < u.plt[i-1].end) {
				t.Fatalf("PLT entries out of order: %+v", u.plt)
			}
			u.lookup(e.start)
		}
		for _, off := range []uint64{0, 0x1000, 1<<64 - 1} {
			u.lookup(off)
		}
	})
}
