package symbolize

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/trace"
)

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	tool := testenv.RequireTool(t, name)
	if out, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// splitDebug builds testProgram with -g, moves its debug information to a separate
// file, strips the binary to .dynsym and links the two by .gnu_debuglink. It returns
// the stripped binary and the debug file, next to each other.
func splitDebug(t testing.TB) (stripped, debug string) {
	t.Helper()
	bin := buildC(t, testProgram, append([]string{"-Wl,--build-id", "-rdynamic"}, pieArgs...)...)
	debug = bin + ".debug"
	stripped = bin + ".stripped"
	run(t, "objcopy", "--only-keep-debug", "--compress-debug-sections=zlib", bin, debug)
	run(t, "strip", "--strip-all", "-o", stripped, bin)
	run(t, "objcopy", "--add-gnu-debuglink="+debug, stripped)
	return stripped, debug
}

// symbolAddrs returns the ELF virtual addresses of testProgram's functions.
func symbolAddrs(t testing.TB, bin string) map[string]uint64 {
	t.Helper()
	addrs := map[string]uint64{}
	for _, s := range nmSymbols(t, bin) {
		addrs[s.name] = s.addr
	}
	return addrs
}

// symbolizeAt names the code at vaddr+1 in bin (vaddr from the unstripped build).
func symbolizeAt(t testing.TB, s *Symbolizer, m *trace.Mapping, vaddr uint64) (*trace.Location, []error) {
	t.Helper()
	loc := locationsAt(t, m, []uint64{vaddr + 1})[0]
	errs := s.Symbolize(&trace.Profile{Locations: []*trace.Location{loc}})
	return loc, errs
}

func TestSymbolizerSeparateDebugFile(t *testing.T) {
	stripped, debug := splitDebug(t)
	addrs := symbolAddrs(t, debug) // the debug file keeps .symtab
	ef, err := elf.Open(stripped)
	if err != nil {
		t.Fatal(err)
	}
	if ef.Section(".symtab") != nil || ef.Section(".debug_info") != nil || ef.Section(".gnu_debuglink") == nil {
		t.Fatal("the stripped binary keeps .symtab or .debug_info, or has no .gnu_debuglink")
	}
	ef.Close()

	// helper is static: only .symtab names it, and only the debug file has one.
	t.Run("gnu_debuglink", func(t *testing.T) {
		s := New(Options{DebugDirs: []string{}})
		m := wholeFile(t, stripped, objfile.Key{Dev: 1, Inode: 30})
		loc, errs := symbolizeAt(t, s, m, addrs["helper"])
		if len(errs) != 0 {
			t.Fatal(errs)
		}
		if len(loc.Lines) != 1 || loc.Lines[0].Function != "helper" || loc.NameSource != SourceDWARF ||
			!strings.HasSuffix(loc.Lines[0].File, "prog.c") || loc.Lines[0].Line == 0 {
			t.Errorf("helper: %+v from %q, want helper at a line of prog.c from DWARF", loc.Lines, loc.NameSource)
		}
		if st := s.Stats(); st.DebugFilesUsed != 1 {
			t.Errorf("DebugFilesUsed = %d", st.DebugFilesUsed)
		}
	})

	t.Run("symtab mode reads the debug file's .symtab only", func(t *testing.T) {
		s := New(Options{Mode: ModeSymtab, DebugDirs: []string{}})
		m := wholeFile(t, stripped, objfile.Key{Dev: 1, Inode: 31})
		loc, errs := symbolizeAt(t, s, m, addrs["helper"])
		if len(errs) != 0 {
			t.Fatal(errs)
		}
		if len(loc.Lines) != 1 || loc.Lines[0].Function != "helper" || loc.NameSource != SourceSymtab || loc.Lines[0].Line != 0 {
			t.Errorf("helper: %+v from %q, want helper from symtab without a line", loc.Lines, loc.NameSource)
		}
	})

	t.Run("build-id directory", func(t *testing.T) {
		f, err := elf.Open(stripped)
		if err != nil {
			t.Fatal(err)
		}
		id := objfile.GNUBuildID(f)
		f.Close()
		if id == "" {
			t.Fatal("no build id")
		}
		// Without the debug link, in a directory of its own: only the build ID finds it.
		dir := t.TempDir()
		bin := filepath.Join(dir, "prog")
		run(t, "objcopy", "--remove-section=.gnu_debuglink", stripped, bin)
		debugDir := t.TempDir()
		p := filepath.Join(debugDir, ".build-id", id[:2], id[2:]+".debug")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(debug)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		s := New(Options{DebugDirs: []string{debugDir}})
		m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 32})
		m.File.GNUBuildID = id
		loc, errs := symbolizeAt(t, s, m, addrs["helper"])
		if len(errs) != 0 || len(loc.Lines) != 1 || loc.Lines[0].Function != "helper" || loc.NameSource != SourceDWARF {
			t.Errorf("helper: %+v from %q, errors %v", loc.Lines, loc.NameSource, errs)
		}
	})

	t.Run("crc mismatch", func(t *testing.T) {
		dir := t.TempDir()
		bin := filepath.Join(dir, "prog")
		data, err := os.ReadFile(stripped)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
		// A debug file of the right name but other contents, as after an upgrade of
		// the binary without its debug package.
		other, err := os.ReadFile(debug)
		if err != nil {
			t.Fatal(err)
		}
		other[len(other)-1] ^= 0xff
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(debug)), other, 0o644); err != nil {
			t.Fatal(err)
		}
		s := New(Options{DebugDirs: []string{}})
		m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 33})
		loc, errs := symbolizeAt(t, s, m, addrs["exported_fn"])
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), "crc") {
			t.Errorf("errors %v, want one about the crc", errs)
		}
		// .dynsym still names the exported function.
		if len(loc.Lines) != 1 || loc.Lines[0].Function != "exported_fn" || loc.NameSource != SourceDynsym {
			t.Errorf("exported_fn: %+v from %q, want it from dynsym", loc.Lines, loc.NameSource)
		}
		if _, errs := symbolizeAt(t, s, m, addrs["leaf"]); len(errs) != 0 {
			t.Errorf("second lookup: errors %v, want the failure reported once", errs)
		}
		if st := s.Stats(); st.DebugInfoFailed != 1 || st.DebugFilesUsed != 0 {
			t.Errorf("stats %+v", st)
		}
	})
}

// libcWithDebugFile returns the C library and its build ID, whose debug file Debian's
// libc6-dbg installs under /usr/lib/debug/.build-id.
func libcWithDebugFile(t *testing.T) (string, string) {
	t.Helper()
	lib := "/usr/lib/x86_64-linux-gnu/libc.so.6"
	if _, err := os.Stat(lib); err != nil {
		testenv.Unavailable(t, "no %s", lib)
	}
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	id := objfile.GNUBuildID(f)
	f.Close()
	if _, err := os.Stat(filepath.Join("/usr/lib/debug/.build-id", id[:2], id[2:]+".debug")); err != nil {
		testenv.Unavailable(t, "no debug file for libc (apt-get install libc6-dbg): %v", err)
	}
	return lib, id
}

// Debian's libc6-dbg installs the C library's DWARF under /usr/lib/debug/.build-id.
func TestSymbolizerLibcDebugPackage(t *testing.T) {
	lib, id := libcWithDebugFile(t)
	var qsort uint64
	for _, s := range nmSymbols(t, lib, "-D") {
		if name, _, _ := strings.Cut(s.name, "@"); name == "qsort_r" {
			qsort = s.addr
		}
	}
	if qsort == 0 {
		t.Fatal("nm -D lists no qsort_r")
	}
	s := New(Options{})
	m := wholeFile(t, lib, objfile.Key{Dev: 1, Inode: 40})
	m.File.GNUBuildID = id
	loc, errs := symbolizeAt(t, s, m, qsort+8)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	if len(loc.Lines) == 0 || loc.NameSource != SourceDWARF {
		t.Fatalf("qsort_r+9: %+v from %q, want DWARF lines", loc.Lines, loc.NameSource)
	}
	outer := loc.Lines[len(loc.Lines)-1]
	if !strings.Contains(outer.Function, "qsort") || !strings.HasSuffix(loc.Lines[0].File, ".c") || loc.Lines[0].Line == 0 {
		t.Errorf("qsort_r+9: %+v", loc.Lines)
	}
	if st := s.Stats(); st.DebugFilesUsed != 1 || st.FilesLoaded != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestSymbolizerModes(t *testing.T) {
	bin := buildC(t, testProgram, pieArgs...)
	addrs := symbolAddrs(t, bin)
	for _, tc := range []struct {
		mode     Mode
		source   string
		withLine bool
	}{
		{ModeFull, SourceDWARF, true},
		{"", SourceDWARF, true},
		{"bogus", SourceDWARF, true},
		{ModeSymtab, SourceSymtab, false},
		{ModeNone, SourceNone, false},
	} {
		s := New(Options{Mode: tc.mode})
		m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 50})
		loc, errs := symbolizeAt(t, s, m, addrs["helper"])
		if len(errs) != 0 {
			t.Fatal(errs)
		}
		if loc.NameSource != tc.source || (len(loc.Lines) > 0 && (loc.Lines[0].Line != 0) != tc.withLine) {
			t.Errorf("mode %q: %+v from %q, want source %q, a line: %v", tc.mode, loc.Lines, loc.NameSource, tc.source, tc.withLine)
		}
		if tc.mode == ModeNone {
			if len(loc.Lines) != 0 || s.Stats().FilesLoaded != 0 {
				t.Errorf("mode none named %+v or read files: %+v", loc.Lines, s.Stats())
			}
			k := &trace.Location{Kind: trace.FrameKernel, Address: 0xffffffff81002110}
			s.Symbolize(&trace.Profile{Locations: []*trace.Location{k}})
			if len(k.Lines) != 0 || k.NameSource != SourceNone {
				t.Errorf("mode none named a kernel frame: %+v", k.Lines)
			}
		}
	}
	for _, in := range []string{"full", "symtab", "none"} {
		if m, err := ParseMode(in); err != nil || string(m) != in {
			t.Errorf("ParseMode(%q) = %q, %v", in, m, err)
		}
	}
	if _, err := ParseMode("dwarf"); err == nil {
		t.Error("ParseMode(dwarf) succeeded")
	}
}

// Files are cached by build ID: two paths to one binary (containers) are read once,
// and the file cache holds at most FileCacheSize files.
func TestSymbolizerCaches(t *testing.T) {
	a := buildC(t, testProgram, pieArgs...)
	b := buildC(t, strings.Replace(testProgram, "x * 3 + 1", "x * 5 + 2", 1), pieArgs...)
	addrsA, addrsB := symbolAddrs(t, a), symbolAddrs(t, b)
	buildID := func(p string) string {
		f, err := elf.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return objfile.GNUBuildID(f)
	}
	if buildID(a) == buildID(b) {
		t.Fatal("two programs share a build id")
	}
	s := New(Options{FileCacheSize: 1, AddressCacheSize: 4})
	mA1 := wholeFile(t, a, objfile.Key{Dev: 1, Inode: 60})
	mA2 := wholeFile(t, a, objfile.Key{Dev: 2, Inode: 61}) // the same binary in another container
	mB := wholeFile(t, b, objfile.Key{Dev: 1, Inode: 62})
	mA1.File.GNUBuildID, mA2.File.GNUBuildID, mB.File.GNUBuildID = buildID(a), buildID(a), buildID(b)

	check := func(m *trace.Mapping, vaddr uint64, want string) {
		t.Helper()
		loc, errs := symbolizeAt(t, s, m, vaddr)
		if len(errs) != 0 || len(loc.Lines) == 0 || loc.Lines[0].Function != want {
			t.Errorf("%s: %+v, %v", want, loc.Lines, errs)
		}
	}
	check(mA1, addrsA["helper"], "helper")
	check(mA2, addrsA["leaf"], "leaf")
	if st := s.Stats(); st.FilesLoaded != 1 || st.CachedFiles != 1 {
		t.Errorf("after two copies of one binary: %+v, want it read once", st)
	}
	check(mB, addrsB["helper"], "helper")
	check(mA2, addrsA["exported_fn"], "exported_fn")
	st := s.Stats()
	if st.FilesLoaded != 3 || st.FilesEvicted != 2 || st.CachedFiles != 1 {
		t.Errorf("alternating two files through a cache of one: %+v", st)
	}
	// The address cache answers without the file: a, evicted, still names helper.
	check(mA1, addrsA["helper"], "helper")
	if st2 := s.Stats(); st2.AddressHits != st.AddressHits+1 || st2.FilesLoaded != st.FilesLoaded {
		t.Errorf("a cached address: %+v after %+v", st2, st)
	}
	if st := s.Stats(); st.CachedFileBytes <= 0 || st.CachedFileBytes > 1<<20 {
		t.Errorf("CachedFileBytes = %d for one small file", st.CachedFileBytes)
	}
}

// The frames under the innermost are return addresses; the instruction before one
// is the call the frame stands for.
func TestSymbolizerReturnAddresses(t *testing.T) {
	bin := buildC(t, testProgram, pieArgs...)
	addrs := symbolAddrs(t, bin)
	m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 70})
	// A return address at the first byte of exported_fn, as after a call that never
	// returns at the end of the function before it.
	at := locationsAt(t, m, []uint64{addrs["exported_fn"]})
	leaf := &trace.Location{Kind: trace.FrameNative, Address: at[0].Address - 0x10, Mapping: m}
	caller := at[0]
	kernelLeaf := &trace.Location{Kind: trace.FrameKernel, Address: 0xffffffff81002100}
	kernelCaller := &trace.Location{Kind: trace.FrameKernel, Address: 0xffffffff81002100}
	p := &trace.Profile{
		Locations: []*trace.Location{leaf, caller, kernelLeaf, kernelCaller},
		Samples:   []*trace.Sample{{Count: 1, Locations: []*trace.Location{kernelLeaf, kernelCaller, leaf, caller}}},
	}
	s := New(Options{KallsymsPath: writeKallsyms(t, testKallsyms)})
	if errs := s.Symbolize(p); len(errs) != 0 {
		t.Fatal(errs)
	}
	if len(caller.Lines) > 0 && caller.Lines[len(caller.Lines)-1].Function == "exported_fn" {
		t.Errorf("return address at exported_fn's entry named %+v: the call is before it", caller.Lines)
	}
	if len(kernelLeaf.Lines) != 1 || kernelLeaf.Lines[0].Function != "schedule" {
		t.Errorf("kernel leaf at schedule: %+v", kernelLeaf.Lines)
	}
	if len(kernelCaller.Lines) != 1 || kernelCaller.Lines[0].Function != "arch_cpu_idle" {
		t.Errorf("kernel return address at schedule's entry: %+v, want the function before it", kernelCaller.Lines)
	}
	// The same address as the innermost frame is exported_fn itself.
	alone := &trace.Location{Kind: trace.FrameNative, Address: caller.Address, Mapping: m}
	s.Symbolize(&trace.Profile{Locations: []*trace.Location{alone},
		Samples: []*trace.Sample{{Count: 1, Locations: []*trace.Location{alone}}}})
	if len(alone.Lines) != 1 || alone.Lines[0].Function != "exported_fn" {
		t.Errorf("leaf at exported_fn's entry: %+v", alone.Lines)
	}
}

// A file whose DWARF is corrupt keeps the names of its symbol table; the error is
// returned once and counted.
func TestSymbolizerCorruptDWARF(t *testing.T) {
	bin := buildC(t, testProgram, pieArgs...)
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	line := f.Section(".debug_line")
	// A line program claiming more bytes than its section holds.
	binary.LittleEndian.PutUint32(data[line.Offset:], uint32(line.Size)+1000)
	bad := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(bad, data, 0o755); err != nil {
		t.Fatal(err)
	}
	addrs := symbolAddrs(t, bin)
	s := New(Options{})
	m := wholeFile(t, bad, objfile.Key{Dev: 1, Inode: 80})
	loc, errs := symbolizeAt(t, s, m, addrs["helper"])
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "dwarf") || !strings.Contains(errs[0].Error(), bad) {
		t.Errorf("errors %v, want one about the dwarf of %s", errs, bad)
	}
	if len(loc.Lines) != 1 || loc.Lines[0].Function != "helper" || loc.NameSource != SourceSymtab {
		t.Errorf("helper: %+v from %q, want it from symtab", loc.Lines, loc.NameSource)
	}
	if _, errs := symbolizeAt(t, s, m, addrs["leaf"]); len(errs) != 0 {
		t.Errorf("again: %v", errs)
	}
	if st := s.Stats(); st.DebugInfoFailed != 1 || st.FilesFailed != 0 {
		t.Errorf("stats %+v", st)
	}
}
