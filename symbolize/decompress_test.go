package symbolize

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
	"github.com/sonde-profiler/sonde/trace"
)

// marksHeld is what the files' DWARF keeps to enter its compressed streams again, held
// however idle the files are.
func marksHeld(s *Symbolizer) int64 {
	var n int64
	s.files.Each(func(_ fileID, e fileEntry) {
		if e.obj != nil && e.obj.dwarf != nil {
			n += e.obj.dwarf.MarkBytes()
		}
	})
	return n
}

// Naming passes over a file with compressed DWARF decompress it once: a second pass over
// the same addresses finds them named, and passes over new addresses in the units decoded
// already an interval or two later read no section. Inflating them again at every pass
// was most of a busy agent's steady CPU. (The program is one unit; TestLibcPassesHoldWhatTheyNeed has
// passes that need new units.)
func TestNamingPassesDecompressOnce(t *testing.T) {
	bin := testprog.BuildCXX(t, "-O2", "-gdwarf-4", "-gz")
	s := New(Options{})
	now := time.Unix(1_000_000, 0)
	s.now = func() time.Time { return now }
	m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 77})
	addrs := spreadText(t, bin, 40)
	pass := func(vaddrs []uint64) (named int) {
		t.Helper()
		locs := locationsAt(t, m, vaddrs)
		if errs := s.Symbolize(&trace.Profile{Locations: locs}); len(errs) > 0 {
			t.Fatalf("symbolize: %v", errs)
		}
		for _, l := range locs {
			if l.NameSource == SourceDWARF {
				named++
			}
		}
		return named
	}
	if n := pass(addrs[:20]); n == 0 {
		t.Fatal("nothing named from DWARF: the test does not exercise it")
	}
	first := s.Stats().DecompressedTotalBytes
	if first == 0 {
		t.Fatal("nothing decompressed: the -gz build has no compressed section")
	}
	pass(addrs[:20])
	if got := s.Stats().DecompressedTotalBytes; got != first {
		t.Errorf("a second pass over the same addresses decompressed %d bytes more", got-first)
	}
	for range 2 {
		now = now.Add(10 * time.Second) // intervals, past the pages' release
		pass(addrs[20:])
	}
	if got := s.Stats().DecompressedTotalBytes; got != first {
		t.Errorf("passes over new addresses 10 s apart decompressed %d bytes more", got-first)
	}
	// A file no pass uses for a while gives its copies back, at a pass that names
	// something else.
	if st := s.Stats(); st.DecompressedBytes == 0 {
		t.Fatal("the copies went before the file was idle")
	}
	now = now.Add(dwarfIdleMin)
	kernel := &trace.Location{Kind: trace.FrameKernel, Address: 0xffffffff81000000}
	s.Symbolize(&trace.Profile{Locations: []*trace.Location{kernel}})
	if st := s.Stats(); st.DecompressedBytes != marksHeld(s) {
		t.Errorf("%d bytes of decompressed DWARF held by a file idle for %v, %d of them marks", st.DecompressedBytes, dwarfIdleMin, marksHeld(s))
	}
}

// A file whose hot code is named gives its decompressed sections back, although it is
// still sampled: lookups of new addresses in units decoded already read no section, and
// do not keep the copies (10 MiB for a distribution's libc) for as long as the file is in
// use.
func TestDecodedUnitsDoNotHoldSections(t *testing.T) {
	bin := testprog.BuildCXX(t, "-O2", "-gdwarf-4", "-gz")
	s := New(Options{})
	now := time.Unix(1_000_000, 0)
	s.now = func() time.Time { return now }
	m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 78})
	addrs := spreadText(t, bin, 40)
	pass := func(vaddrs []uint64) {
		t.Helper()
		if errs := s.Symbolize(&trace.Profile{Locations: locationsAt(t, m, vaddrs)}); len(errs) > 0 {
			t.Fatalf("symbolize: %v", errs)
		}
	}
	pass(addrs)
	st := s.Stats()
	if st.DecompressedBytes == 0 {
		t.Fatal("nothing decompressed: the -gz build has no compressed section")
	}
	// Every pass names addresses never seen, one byte further into the same functions:
	// the same units, which the unit cache holds.
	for i := uint64(1); now.Sub(time.Unix(1_000_000, 0)) <= dwarfIdleMin+10*time.Second; i++ {
		now = now.Add(10 * time.Second)
		shifted := make([]uint64, len(addrs))
		for j, a := range addrs {
			shifted[j] = a + i
		}
		pass(shifted)
	}
	after := s.Stats()
	if after.DecompressedBytes != marksHeld(s) {
		t.Errorf("%d bytes of decompressed DWARF still held after %v of lookups in decoded units, %d of them marks", after.DecompressedBytes, dwarfIdleMin, marksHeld(s))
	}
	if after.DecompressedTotalBytes != st.DecompressedTotalBytes {
		t.Errorf("lookups in decoded units decompressed %d bytes more", after.DecompressedTotalBytes-st.DecompressedTotalBytes)
	}
}

// A file whose sections are needed again after they went keeps them twice as long each
// time: a long tail of new units decompresses a few times in all, not once an interval.
func TestSectionsNeededAgainStayLonger(t *testing.T) {
	bin := testprog.BuildCXX(t, "-O2", "-gdwarf-4", "-gz")
	s := New(Options{AddressCacheSize: -1})
	now := time.Unix(1_000_000, 0)
	s.now = func() time.Time { return now }
	m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 79})
	addrs := spreadText(t, bin, 40)
	pass := func(vaddrs []uint64) {
		t.Helper()
		if errs := s.Symbolize(&trace.Profile{Locations: locationsAt(t, m, vaddrs)}); len(errs) > 0 {
			t.Fatalf("symbolize: %v", errs)
		}
	}
	held := func() bool { return s.Stats().DecompressedBytes > marksHeld(s) }
	// Other files' passes: the idle file is trimmed at each.
	tick := func(d time.Duration) {
		now = now.Add(d)
		s.Symbolize(&trace.Profile{Locations: []*trace.Location{{Kind: trace.FrameKernel, Address: 0xffffffff81000000}}})
	}
	pass(addrs[:10])
	once := s.Stats().DecompressedTotalBytes
	if once == 0 || !held() {
		t.Fatal("nothing decompressed: the -gz build has no compressed section")
	}
	tick(dwarfIdleMin)
	if held() {
		t.Fatalf("sections held after %v idle", dwarfIdleMin)
	}
	idle := dwarfIdleMin
	for round := 1; round <= 3; round++ {
		// New units (the decoded ones dropped, as other files' units evict them): the
		// sections are decompressed again, and kept twice as long.
		s.units.Shed()
		pass(addrs[10*round : 10*round+10])
		if got := s.Stats().DecompressedTotalBytes; got != once*int64(round+1) {
			t.Fatalf("round %d: %d bytes decompressed in all, want %d", round, got, once*int64(round+1))
		}
		idle *= 2
		tick(idle - time.Second)
		if !held() {
			t.Fatalf("round %d: sections gone after %v, want them kept %v", round, idle-time.Second, idle)
		}
		tick(time.Second)
		if held() {
			t.Fatalf("round %d: sections held after %v idle", round, idle)
		}
	}
}

// A distribution's libc debug file (8.6 MB of compressed DWARF decompressed) is
// decompressed where a pass's new units lie, and what a pass decompressed goes when it
// ends: passes hold a small part of it, however many keep decoding new units (a file
// whose sections come to dwarfHoldMaxBytes at most would hold them whole from the
// fourth). Once idle, it keeps only the marks its streams are entered at.
func TestLibcPassesHoldWhatTheyNeed(t *testing.T) {
	lib, id := libcWithDebugFile(t)
	var funcs []uint64
	for _, s := range nmSymbols(t, lib, "-D") {
		if (s.typ == 'T' || s.typ == 'W' || s.typ == 'i') && s.size > 8 && len(funcs) < 4000 {
			funcs = append(funcs, s.addr)
		}
	}
	slices.Sort(funcs)
	funcs = slices.Compact(funcs)
	if len(funcs) < 600 {
		t.Fatalf("nm -D lists %d functions", len(funcs))
	}
	s := New(Options{})
	now := time.Unix(1_000_000, 0)
	s.now = func() time.Time { return now }
	m := wholeFile(t, lib, objfile.Key{Dev: 1, Inode: 41})
	m.File.GNUBuildID = id
	round := 0
	pass := func() (decompressed, held int64) {
		t.Helper()
		// Ten functions spread over the library, new ones each pass.
		var vaddrs []uint64
		for i := range 10 {
			vaddrs = append(vaddrs, funcs[(i*len(funcs)/10+round*7)%len(funcs)]+4)
		}
		round++
		return dwarfPass(t, s, m, vaddrs)
	}
	// Of the 8.6 MB the sections decompress to: the marks, .debug_abbrev packed once
	// passes keep walking it, the small sections.
	const small = 2 << 20
	d, held := pass()
	if st := s.Stats(); d == 0 || held > small || st.DecompressedPeakBytes > 2*small {
		t.Fatalf("first pass: %d bytes decompressed, %d held after it, %d at most: want under %d held", d, held, st.DecompressedPeakBytes, small)
	}
	// Passes after it, new units each, past the passes that would hold a smaller file's
	// sections: each decompresses what it needs and holds little after it.
	for i := 2; i <= dwarfHoldPasses+2; i++ {
		now = now.Add(5 * time.Second)
		d, held = pass()
		t.Logf("pass %d: %d bytes decompressed, %d held after it", i, d, held)
		if d == 0 || held > small {
			t.Fatalf("pass %d: %d bytes decompressed, %d held after it: want new units read, under %d held", i, d, held, small)
		}
	}
	if st := s.Stats(); st.DecompressedPeakBytes > 2*small {
		t.Errorf("%d bytes decompressed at most, want under %d", st.DecompressedPeakBytes, 2*small)
	}
	now = now.Add(dwarfIdleMin)
	s.Symbolize(&trace.Profile{Locations: []*trace.Location{{Kind: trace.FrameKernel, Address: 0xffffffff81000000}}})
	// What stays is the marks into the zlib streams (32 KB windows every 128 KB of
	// output, compressed) and the sections packed in place of theirs.
	if st := s.Stats(); st.DecompressedBytes == 0 || st.DecompressedBytes > 3<<19 {
		t.Errorf("%d bytes held after %v idle, want the marks and packed sections alone, 1.5 MB at most", st.DecompressedBytes, dwarfIdleMin)
	}
}

// A file whose compressed DWARF is small (dwarfHoldMaxBytes at most) and whose passes
// keep decoding new units holds its decompressed sections from the dwarfHoldPasses-th
// pass on: later passes' new units cost no decompression. Once the file is idle, the
// sections go.
func TestSmallFilePassesHold(t *testing.T) {
	gcc := testenv.RequireTool(t, "gcc")
	dir := t.TempDir()
	const units = 12
	args := []string{"-O2", "-g", "-gz", "-o", filepath.Join(dir, "prog")}
	var main strings.Builder
	for i := range units {
		// Units of some size each, so that a pass's unit is not in a block decompressed
		// for the one before.
		var body strings.Builder
		for j := range 60 {
			fmt.Fprintf(&body, "__attribute__((noinline)) int u%d_f%d(int x) { for (int k = 0; k < x; k++) x ^= k * %d; return x + %d; }\n", i, j, j+3, j)
		}
		fmt.Fprintf(&body, "int unit%d(int x) { return u%d_f0(x)", i, i)
		for j := 1; j < 60; j++ {
			fmt.Fprintf(&body, " + u%d_f%d(x)", i, j)
		}
		body.WriteString("; }\n")
		src := filepath.Join(dir, fmt.Sprintf("u%d.c", i))
		if err := os.WriteFile(src, []byte(body.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, src)
		fmt.Fprintf(&main, "int unit%d(int);\n", i)
	}
	main.WriteString("int main(int argc, char **argv) { (void)argv; int s = 0;\n")
	for i := range units {
		fmt.Fprintf(&main, "s += unit%d(argc);\n", i)
	}
	main.WriteString("return s; }\n")
	mainSrc := filepath.Join(dir, "main.c")
	if err := os.WriteFile(mainSrc, []byte(main.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	args = append(args, mainSrc)
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "prog")
	addrs := map[string]uint64{}
	for _, s := range nmSymbols(t, bin) {
		addrs[s.name] = s.addr
	}
	s := New(Options{})
	now := time.Unix(1_000_000, 0)
	s.now = func() time.Time { return now }
	m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 80})
	pass := func(unit int) (decompressed, held int64) {
		t.Helper()
		var vaddrs []uint64
		for j := 0; j < 60; j += 15 {
			a, ok := addrs[fmt.Sprintf("u%d_f%d", unit, j)]
			if !ok {
				t.Fatalf("no symbol u%d_f%d", unit, j)
			}
			vaddrs = append(vaddrs, a+2)
		}
		return dwarfPass(t, s, m, vaddrs)
	}
	// The first pass loads the file; passes after it within the idle time count.
	unit := 0
	for ; unit <= dwarfHoldPasses; unit++ {
		d, held := pass(unit)
		t.Logf("pass over unit %d: %d bytes decompressed, %d held after it", unit, d, held)
		if unit == 0 && d == 0 {
			t.Fatal("nothing decompressed: the -gz build has no compressed section")
		}
		now = now.Add(5 * time.Second)
	}
	_, heldWhole := pass(unit)
	for unit++; unit < units; unit++ {
		now = now.Add(5 * time.Second)
		d, held := pass(unit)
		if d != 0 || held < heldWhole {
			t.Errorf("pass over unit %d, after %d passes of new units: %d bytes decompressed, %d held (%d before); want none decompressed, the sections held", unit, dwarfHoldPasses+1, d, held, heldWhole)
		}
	}
	now = now.Add(dwarfIdleMin)
	s.Symbolize(&trace.Profile{Locations: []*trace.Location{{Kind: trace.FrameKernel, Address: 0xffffffff81000000}}})
	if st := s.Stats(); st.DecompressedBytes >= heldWhole {
		t.Errorf("%d bytes held after %v idle (%d while in use): want the sections let go", st.DecompressedBytes, dwarfIdleMin, heldWhole)
	}
}

// dwarfPass names addresses in m, each of which must be named from DWARF, and returns the
// bytes the pass decompressed and those held after it.
func dwarfPass(t *testing.T, s *Symbolizer, m *trace.Mapping, vaddrs []uint64) (decompressed, held int64) {
	t.Helper()
	before := s.Stats().DecompressedTotalBytes
	locs := locationsAt(t, m, vaddrs)
	s.Symbolize(&trace.Profile{Locations: locs})
	for _, l := range locs {
		if l.NameSource != SourceDWARF {
			t.Fatalf("%#x named from %q, want DWARF", l.Address, l.NameSource)
		}
	}
	st := s.Stats()
	return st.DecompressedTotalBytes - before, st.DecompressedBytes
}
