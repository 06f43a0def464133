package symbolize

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

const pageMask = 0xfff

// mapText maps the executable segment of bin at base the way the loader would and
// returns the mapping and the runtime address of each function of bin.
func mapText(t *testing.T, bin string, base uint64, file *objfile.File) (*trace.Mapping, map[string]uint64) {
	t.Helper()
	addrs := map[string]uint64{}
	var text loadHeader
	for _, s := range nmSymbols(t, bin) {
		if s.name == "exported_fn" {
			_, text = fileOffsetOf(t, readelfLoads(t, bin), s.addr)
		}
		addrs[s.name] = base + s.addr
	}
	if text.filesz == 0 {
		t.Fatal("exported_fn not found")
	}
	start := base + text.vaddr&^pageMask
	return &trace.Mapping{
		Start:  start,
		End:    (base + text.vaddr + text.filesz + pageMask) &^ pageMask,
		Offset: text.off &^ pageMask,
		Path:   bin,
		File:   file,
	}, addrs
}

func writeKallsyms(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kallsyms")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSymbolizer(t *testing.T) {
	bin := buildC(t, testProgram, pieArgs...)
	const base = 0x5555_5555_0000
	file := objfile.HostFile(objfile.Key{Dev: 1, Inode: 2}, bin)
	m, addrs := mapText(t, bin, base, file)
	missingPath := filepath.Join(t.TempDir(), "gone.so")
	missing := &trace.Mapping{
		Start: 0x7f00_0000_0000, End: 0x7f00_0001_0000, Path: missingPath,
		File: objfile.HostFile(objfile.Key{Dev: 1, Inode: 3}, missingPath),
	}

	exported := &trace.Location{Kind: trace.FrameNative, Address: addrs["exported_fn"] + 3, Mapping: m}
	helper := &trace.Location{Kind: trace.FrameNative, Address: addrs["helper"], Mapping: m}
	inMissing := &trace.Location{Kind: trace.FrameNative, Address: missing.Start + 0x10, Mapping: missing}
	// The end of the mapped page is past the segment's file contents.
	padding := &trace.Location{Kind: trace.FrameNative, Address: m.End - 1, Mapping: m}
	anonymous := &trace.Location{Kind: trace.FrameNative, Address: 0x1234}
	kernel := &trace.Location{Kind: trace.FrameKernel, Address: 0xffffffff81002110}
	named := &trace.Location{Kind: trace.FrameNative, Address: addrs["leaf"], Mapping: m,
		Lines: []trace.Line{{Function: "already"}}}

	s := New(Options{KallsymsPath: writeKallsyms(t, testKallsyms)})
	p := &trace.Profile{Locations: []*trace.Location{exported, helper, inMissing, padding, anonymous, kernel, named, nil}}
	errs := s.Symbolize(p)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), missingPath) {
		t.Fatalf("errors = %v, want one naming %s", errs, missingPath)
	}
	for _, tc := range []struct {
		loc          *trace.Location
		want, source string
	}{
		{exported, "exported_fn", SourceDWARF},
		{helper, "helper", SourceDWARF},
		{inMissing, "", SourceNone},
		{padding, "", SourceNone},
		{anonymous, "", SourceNone},
		{kernel, "schedule", SourceKallsyms},
		{named, "already", ""}, // named before: untouched
	} {
		var got string
		if len(tc.loc.Lines) > 0 {
			got = tc.loc.Lines[0].Function
		}
		if got != tc.want || len(tc.loc.Lines) > 1 || tc.loc.NameSource != tc.source {
			t.Errorf("location %#x: lines %+v from %q, want %q from %q", tc.loc.Address, tc.loc.Lines, tc.loc.NameSource, tc.want, tc.source)
		}
	}
	if l := exported.Lines[0]; l.Line == 0 || !strings.HasSuffix(l.File, "prog.c") {
		t.Errorf("exported_fn: %s:%d, want a line in prog.c from DWARF", l.File, l.Line)
	}
	if got := exported.Lines[0].SystemName; got != "exported_fn" {
		t.Errorf("SystemName = %q", got)
	}

	// A later profile meets the same files: nothing is read again, nothing reported again.
	again := &trace.Location{Kind: trace.FrameNative, Address: missing.Start + 0x20, Mapping: missing}
	leaf := &trace.Location{Kind: trace.FrameNative, Address: addrs["leaf"] + 1, Mapping: m}
	if errs := s.Symbolize(&trace.Profile{Locations: []*trace.Location{again, leaf}}); len(errs) != 0 {
		t.Errorf("second Symbolize: errors %v, want none", errs)
	}
	if len(leaf.Lines) != 1 || leaf.Lines[0].Function != "leaf" {
		t.Errorf("leaf: lines %+v", leaf.Lines)
	}
	// The missing file's failure is cached: not retried, not reported again.
	want := Stats{FilesLoaded: 1, FilesFailed: 1, LocationsNamed: 4, LocationsUnnamed: 4,
		CachedFiles: 2, AddressMisses: 6, CachedAddresses: 4}
	got := s.Stats()
	if got.CachedFileBytes <= 0 || got.CachedDWARFBytes <= 0 || got.CachedAddressBytes <= 0 || got.KernelSymbolBytes <= 0 {
		t.Errorf("CachedFileBytes = %d, CachedDWARFBytes = %d, CachedAddressBytes = %d, KernelSymbolBytes = %d with a file, its DWARF, addresses and kernel symbols held",
			got.CachedFileBytes, got.CachedDWARFBytes, got.CachedAddressBytes, got.KernelSymbolBytes)
	}
	got.CachedFileBytes, got.CachedDWARFBytes, got.CachedAddressBytes, got.KernelSymbolBytes = 0, 0, 0, 0
	if got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
}

func TestSymbolizerKallsymsReload(t *testing.T) {
	path := writeKallsyms(t, testKallsyms)
	s := New(Options{KallsymsPath: path})
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	const newModule = 0xffffffffc0b00010
	symbolize := func(addr uint64) (string, []error) {
		loc := &trace.Location{Kind: trace.FrameKernel, Address: addr}
		errs := s.Symbolize(&trace.Profile{Locations: []*trace.Location{loc}})
		if len(loc.Lines) == 0 {
			return "", errs
		}
		return loc.Lines[0].Function, errs
	}

	if name, errs := symbolize(newModule); name != "" || errs != nil {
		t.Fatalf("before the module loads: %q, %v", name, errs)
	}
	if err := os.WriteFile(path, []byte(testKallsyms+"ffffffffc0b00000 t nf_hook_slow\t[nf_tables]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	now = now.Add(kallsymsReloadInterval - time.Second)
	if name, _ := symbolize(newModule); name != "" {
		t.Fatalf("reread kallsyms %v after the last read", kallsymsReloadInterval-time.Second)
	}
	now = now.Add(time.Second)
	if name, _ := symbolize(newModule); name != "nf_hook_slow" {
		t.Fatalf("after %v: %q, want a reread to find nf_hook_slow", kallsymsReloadInterval, name)
	}

	// A reread that fails keeps the old symbols and reports once.
	if err := os.WriteFile(path, []byte("0000000000000000 T _stext\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	now = now.Add(kallsymsReloadInterval)
	if _, errs := symbolize(0x10); len(errs) != 1 || !errors.Is(errs[0], ErrKernelAddressesHidden) {
		t.Fatalf("errors = %v, want ErrKernelAddressesHidden", errs)
	}
	now = now.Add(kallsymsReloadInterval)
	if _, errs := symbolize(0x10); len(errs) != 0 {
		t.Fatalf("errors = %v, want the failure reported only once", errs)
	}
	if name, _ := symbolize(newModule); name != "nf_hook_slow" {
		t.Fatalf("after a failed reread: %q, want the symbols read before", name)
	}
}

func TestSymbolizerKernelHidden(t *testing.T) {
	s := New(Options{KallsymsPath: writeKallsyms(t, "0000000000000000 T _stext\n")})
	loc := &trace.Location{Kind: trace.FrameKernel, Address: 0xffffffff81000000}
	errs := s.Symbolize(&trace.Profile{Locations: []*trace.Location{loc, loc}})
	if len(errs) != 1 || !errors.Is(errs[0], ErrKernelAddressesHidden) {
		t.Fatalf("errors = %v, want ErrKernelAddressesHidden once", errs)
	}
	if len(loc.Lines) != 0 {
		t.Errorf("lines %+v, want none", loc.Lines)
	}
}

func TestNamedLineDemangles(t *testing.T) {
	for _, tc := range []struct{ raw, want string }{
		{"_ZN2ns5Klass6methodEi", "ns::Klass::method(int)"},
		{"_ZN4core3fmt5write17h0123456789abcdefE", "core::fmt::write"},
		{"_RNvCs1234_7mycrate3foo", "mycrate::foo"},
		{"runtime.mallocgc", "runtime.mallocgc"},
		{"do_syscall_64", "do_syscall_64"},
	} {
		l := namedLine(tc.raw)
		if len(l) != 1 || l[0].Function != tc.want || l[0].SystemName != tc.raw {
			t.Errorf("namedLine(%q) = %+v, want Function %q", tc.raw, l, tc.want)
		}
	}
}

func BenchmarkLookup(b *testing.B) {
	bin := buildC(b, testProgram, pieArgs...)
	syms := readELFFile(b, bin)
	var offs []uint64
	for _, s := range nmSymbols(b, bin) {
		if s.typ == 'T' || s.typ == 't' {
			off, ok := fileOffsetFromELF(syms, s.addr)
			if !ok {
				b.Fatalf("no file offset for %s", s.name)
			}
			offs = append(offs, off+1)
		}
	}
	file := objfile.HostFile(objfile.Key{Dev: 1, Inode: 2}, bin)
	// Mapping the whole file at base makes runtime address = base + file offset.
	const base = 0x5555_5555_0000
	m := &trace.Mapping{Start: base, End: base + 1<<20, File: file}
	locs := make([]*trace.Location, len(offs))
	for i, off := range offs {
		locs[i] = &trace.Location{Kind: trace.FrameNative, Address: base + off, Mapping: m}
	}
	p := &trace.Profile{Locations: locs[:1]}
	s := New(Options{})
	if errs := s.Symbolize(p); errs != nil {
		b.Fatal(errs)
	}

	b.Run("table", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if _, ok := syms.LookupFileOffset(offs[i]); !ok {
				b.Fatal("miss")
			}
			i = (i + 1) % len(offs)
		}
	})
	// A table the size of a large C++ binary's, probed at random, is closer to what a
	// real profile costs than the test program's dozen symbols.
	b.Run("table-100k", func(b *testing.B) {
		const n = 100_000
		big := make([]Symbol, n)
		for i := range big {
			big[i] = Symbol{Name: fmt.Sprintf("fn_%d", i), Value: 0x1000 + uint64(i)*64, Size: 48}
		}
		tab := NewSymbolTable(big)
		r := rand.New(rand.NewPCG(1, 2))
		addrs := make([]uint64, 4096)
		for i := range addrs {
			addrs[i] = 0x1000 + uint64(r.IntN(n))*64 + 8
		}
		i := 0
		for b.Loop() {
			if _, ok := tab.Lookup(addrs[i]); !ok {
				b.Fatal("miss")
			}
			i = (i + 1) % len(addrs)
		}
	})
	// The Symbolizer's cost per location, the file already read: includes demangling
	// and allocating Lines.
	b.Run("symbolizer", func(b *testing.B) {
		i := 0
		for b.Loop() {
			loc := locs[i]
			// Symbolize names only locations without a name source.
			loc.Lines, loc.NameSource = nil, ""
			p.Locations[0] = loc
			s.Symbolize(p)
			if len(loc.Lines) == 0 {
				b.Fatal("miss")
			}
			i = (i + 1) % len(locs)
		}
	})
}

// fileOffsetFromELF inverts Vaddr for the benchmark's set-up.
func fileOffsetFromELF(e *ELFSymbols, vaddr uint64) (uint64, bool) {
	for _, p := range e.loads {
		if vaddr >= p.vaddr && vaddr-p.vaddr < p.filesz {
			return vaddr - p.vaddr + p.off, true
		}
	}
	return 0, false
}

// Shed drops both caches and the decoded DWARF, unmaps the files, reports what it
// freed, and naming goes on afterwards, reading the files again.
func TestSymbolizerShed(t *testing.T) {
	bin := buildC(t, testProgram, pieArgs...)
	m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 500})
	locs := locationsAt(t, m, spreadText(t, bin, 20))
	p := &trace.Profile{Locations: locs}
	s := New(Options{KallsymsPath: writeKallsyms(t, testKallsyms)})
	if errs := s.Symbolize(p); len(errs) != 0 {
		t.Fatal(errs)
	}
	before := s.Stats()
	held := before.CachedFileBytes + before.CachedDWARFBytes + before.CachedAddressBytes
	if before.CachedFiles != 1 || before.CachedAddresses == 0 || before.CachedDWARFBytes == 0 {
		t.Fatalf("before Shed: %+v", before)
	}
	if freed := s.Shed(); freed != held {
		t.Errorf("Shed() = %d, want the %d bytes the caches held", freed, held)
	}
	after := s.Stats()
	if after.CachedFiles != 0 || after.CachedAddresses != 0 || after.CachedFileBytes != 0 ||
		after.CachedDWARFBytes != 0 || after.CachedAddressBytes != 0 ||
		after.Sheds != 1 || after.ShedBytes != held || after.FilesEvicted != before.FilesEvicted {
		t.Errorf("after Shed: %+v", after)
	}
	reset(locs)
	if errs := s.Symbolize(p); len(errs) != 0 {
		t.Fatal(errs)
	}
	if n := countNamedT(locs); n < len(locs)/2 {
		t.Errorf("after Shed: %d of %d named", n, len(locs))
	}
	if st := s.Stats(); st.FilesLoaded != 2 || st.AddressHits != 0 {
		t.Errorf("after Shed: %+v, want the file read again", st)
	}
	if New(Options{Mode: ModeNone}).Shed() != 0 {
		t.Error("Shed of a symbolizer that names nothing freed something")
	}
}

// The caches keep within their bounds in bytes: the address cache evicts names, the
// file cache files, and the file used last stays however large it is.
func TestSymbolizerByteBounds(t *testing.T) {
	a := buildC(t, testProgram, pieArgs...)
	b := buildC(t, strings.Replace(testProgram, "x * 3 + 1", "x * 5 + 2", 1), pieArgs...)
	ma := wholeFile(t, a, objfile.Key{Dev: 1, Inode: 510})
	mb := wholeFile(t, b, objfile.Key{Dev: 1, Inode: 511})
	locs := locationsAt(t, ma, spreadText(t, a, 40))
	s := New(Options{AddressCacheBytes: 2000, FileCacheBytes: 1})
	if errs := s.Symbolize(&trace.Profile{Locations: locs}); len(errs) != 0 {
		t.Fatal(errs)
	}
	st := s.Stats()
	if st.CachedAddressBytes > 2000 || st.CachedAddresses == 0 || st.CachedAddresses >= countNamedT(locs) {
		t.Errorf("a 2000-byte address cache holds %d names of %d bytes", st.CachedAddresses, st.CachedAddressBytes)
	}
	if st.CachedFiles != 1 {
		t.Errorf("%d files cached, want the one in use however large", st.CachedFiles)
	}
	if errs := s.Symbolize(&trace.Profile{Locations: locationsAt(t, mb, spreadText(t, b, 5))}); len(errs) != 0 {
		t.Fatal(errs)
	}
	if st := s.Stats(); st.CachedFiles != 1 || st.FilesEvicted != 1 {
		t.Errorf("a second file through a 1-byte file cache: %+v", st)
	}
}

// Symbolize takes a file's locations together, so that it can let each file's pages
// go before the next file's: kernel frames first, then files in order of first use,
// and the profile's order within each.
func TestByFileGroupsLocations(t *testing.T) {
	a, b := objfile.HostFile(objfile.Key{Dev: 1, Inode: 1}, "/a"), objfile.HostFile(objfile.Key{Dev: 1, Inode: 2}, "/b")
	ma, mb := &trace.Mapping{File: a}, &trace.Mapping{File: b}
	locs := []*trace.Location{
		{Address: 1, Mapping: ma}, {Address: 2, Mapping: mb}, {Address: 3, Kind: trace.FrameKernel},
		{Address: 4, Mapping: ma}, nil, {Address: 5, Mapping: mb, NameSource: SourceSymtab}, {Address: 6, Mapping: mb},
	}
	var got []uint64
	for _, l := range byFile(locs) {
		got = append(got, l.Address)
	}
	if want := []uint64{3, 1, 4, 2, 6}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

// An address kallsyms never names costs one reread, not one every
// kallsymsReloadInterval for as long as it is sampled: each reread parses all of it.
func TestSymbolizerKallsymsMissRereadOnce(t *testing.T) {
	s := New(Options{KallsymsPath: writeKallsyms(t, testKallsyms)})
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	const trampoline = 0xffffffffc0f00010
	for range 10 {
		loc := &trace.Location{Kind: trace.FrameKernel, Address: trampoline}
		s.Symbolize(&trace.Profile{Locations: []*trace.Location{loc}})
		if len(loc.Lines) != 0 {
			t.Fatalf("named %q", loc.Lines[0].Function)
		}
		now = now.Add(kallsymsReloadInterval)
	}
	if s.kernel.reads != 2 {
		t.Errorf("kallsyms read %d times for one address it never names, want 2 (the first read and one reread)", s.kernel.reads)
	}
}
