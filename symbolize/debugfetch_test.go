package symbolize

import (
	"debug/elf"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

// fakeFetcher has a debug file once ready is set, and counts what it is asked.
type fakeFetcher struct {
	mu    sync.Mutex
	path  string
	ready bool
	asked map[string]int
}

func (f *fakeFetcher) DebugFile(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked[id]++
	if f.ready {
		return f.path
	}
	return ""
}

// A stripped file is named as without a fetcher until the fetcher has its debug file;
// the next call reads it again and names its addresses, cached ones included, by DWARF.
func TestSymbolizerFetchedDebugFile(t *testing.T) {
	stripped, debug := splitDebug(t)
	addrs := symbolAddrs(t, debug)
	bin := filepath.Join(t.TempDir(), "prog")
	run(t, "objcopy", "--remove-section=.gnu_debuglink", stripped, bin)
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	id := objfile.GNUBuildID(ef)
	ef.Close()
	fetcher := &fakeFetcher{path: debug, asked: map[string]int{}}
	s := New(Options{DebugDirs: []string{}, DebugFetcher: fetcher})
	m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 90})
	m.File.GNUBuildID = id

	loc, errs := symbolizeAt(t, s, m, addrs["helper"])
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	if loc.NameSource == SourceDWARF || loc.NameSource == SourceSymtab {
		t.Fatalf("helper named %+v from %q before the debug file was fetched", loc.Lines, loc.NameSource)
	}
	before := loc.NameSource
	if fetcher.asked[id] != 1 {
		t.Errorf("fetcher asked %v, want %s once", fetcher.asked, id)
	}
	// Still not there: the same address comes from the address cache as before.
	if loc, _ := symbolizeAt(t, s, m, addrs["helper"]); loc.NameSource != before {
		t.Errorf("second call: %q, want %q", loc.NameSource, before)
	}
	fetcher.mu.Lock()
	fetcher.ready = true
	fetcher.mu.Unlock()
	loc, errs = symbolizeAt(t, s, m, addrs["helper"])
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	if len(loc.Lines) != 1 || loc.Lines[0].Function != "helper" || loc.NameSource != SourceDWARF ||
		!strings.HasSuffix(loc.Lines[0].File, "prog.c") || loc.Lines[0].Line == 0 {
		t.Errorf("helper once fetched: %+v from %q, want helper at a line of prog.c", loc.Lines, loc.NameSource)
	}
	st := s.Stats()
	if st.DebugFilesFetched != 1 || st.DebugFilesUsed != 1 || st.FilesLoaded != 2 {
		t.Errorf("stats %+v: want the file read twice, the second time with the fetched debug file", st)
	}
	// Once named, the fetcher is not asked again.
	n := fetcher.asked[id]
	symbolizeAt(t, s, m, addrs["leaf"])
	if fetcher.asked[id] != n {
		t.Errorf("fetcher asked again after the debug file was used: %v", fetcher.asked)
	}
}

// A fetched file of another build is refused: the frames keep their names.
func TestSymbolizerFetchedDebugFileWrongBuild(t *testing.T) {
	stripped, debug := splitDebug(t)
	other := buildC(t, strings.Replace(testProgram, "x * 3 + 1", "x * 5 + 2", 1), append([]string{"-Wl,--build-id"}, pieArgs...)...)
	otherDebug := other + ".debug"
	run(t, "objcopy", "--only-keep-debug", other, otherDebug)
	bin := filepath.Join(t.TempDir(), "prog")
	run(t, "objcopy", "--remove-section=.gnu_debuglink", stripped, bin)
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	id := objfile.GNUBuildID(ef)
	ef.Close()
	ef, err = elf.Open(otherDebug)
	if err != nil {
		t.Fatal(err)
	}
	otherID := objfile.GNUBuildID(ef)
	ef.Close()
	if otherID == id || otherID == "" {
		t.Fatalf("the other build's id %q, the program's %q", otherID, id)
	}
	fetcher := &fakeFetcher{path: otherDebug, ready: true, asked: map[string]int{}}
	s := New(Options{DebugDirs: []string{}, DebugFetcher: fetcher})
	m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 91})
	m.File.GNUBuildID = id
	loc := locationsAt(t, m, []uint64{symbolAddrs(t, debug)["exported_fn"] + 1})[0]
	errs := s.Symbolize(&trace.Profile{Locations: []*trace.Location{loc}})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "build id") {
		t.Errorf("errors %v, want one about the build id", errs)
	}
	if loc.NameSource == SourceDWARF {
		t.Errorf("named %+v from another build's DWARF", loc.Lines)
	}
}

// A location named before the debug file came outlives its interval in the collector:
// later profiles get a copy named from the debug file, the same copy each time, in
// their locations, samples and chunks, while the location itself and the chunk that
// earlier profiles share stay as they were.
func TestSymbolizerFetchedDebugFileRenames(t *testing.T) {
	stripped, debug := splitDebug(t)
	addrs := symbolAddrs(t, debug)
	bin := filepath.Join(t.TempDir(), "prog")
	run(t, "objcopy", "--remove-section=.gnu_debuglink", stripped, bin)
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	id := objfile.GNUBuildID(ef)
	ef.Close()
	fetcher := &fakeFetcher{path: debug, asked: map[string]int{}}
	s := New(Options{DebugDirs: []string{}, DebugFetcher: fetcher})
	m := wholeFile(t, bin, objfile.Key{Dev: 1, Inode: 92})
	m.File.GNUBuildID = id
	locs := locationsAt(t, m, []uint64{addrs["helper"] + 1, addrs["exported_fn"] + 1})
	leaf, caller := locs[0], locs[1]
	chunk := []*trace.Location{leaf, caller} // as the collector shares it between profiles
	profile := func() *trace.Profile {
		return &trace.Profile{Locations: []*trace.Location{leaf, caller},
			Samples: []*trace.Sample{
				{Count: 1, Locations: []*trace.Location{leaf, caller}, Chunks: [][]*trace.Location{chunk}},
				{Count: 2, Locations: []*trace.Location{leaf, caller}, Chunks: [][]*trace.Location{chunk}},
			}}
	}
	if errs := s.Symbolize(profile()); len(errs) != 0 {
		t.Fatal(errs)
	}
	before, beforeLines := leaf.NameSource, leaf.Lines
	if before == SourceDWARF || before == "" {
		t.Fatalf("leaf named %q before the debug file", before)
	}
	fetcher.mu.Lock()
	fetcher.ready = true
	fetcher.mu.Unlock()

	p := profile()
	if errs := s.Symbolize(p); len(errs) != 0 {
		t.Fatal(errs)
	}
	r := p.Locations[0]
	if r == leaf || r.NameSource != SourceDWARF || len(r.Lines) != 1 || r.Lines[0].Function != "helper" || r.Lines[0].Line == 0 {
		t.Fatalf("leaf in the profile after the fetch: %+v from %q, want a copy named helper from DWARF", r.Lines, r.NameSource)
	}
	if leaf.NameSource != before || len(leaf.Lines) != len(beforeLines) || chunk[0] != leaf {
		t.Error("the stale location or the shared chunk was written")
	}
	for _, smp := range p.Samples {
		if smp.Locations[0] != r || smp.Chunks[0][0] != r || smp.Chunks[0][1] != p.Locations[1] {
			t.Errorf("sample not rewritten: %v, chunk %v, want %p", smp.Locations, smp.Chunks[0], r)
		}
	}
	if &p.Samples[0].Chunks[0][0] != &p.Samples[1].Chunks[0][0] {
		t.Error("two samples sharing a chunk got two copies")
	}
	// The next interval brings the same stale location: the same copy, not named again.
	named := s.Stats().LocationsNamed
	p = profile()
	s.Symbolize(p)
	if p.Locations[0] != r || s.Stats().LocationsNamed != named {
		t.Errorf("third interval: %p (named %d more), want the copy %p as it was", p.Locations[0], s.Stats().LocationsNamed-named, r)
	}
	if st := s.Stats(); st.LocationsRenamed != 2 || st.DebugFilesFetched != 1 {
		t.Errorf("stats %+v, want two locations renamed and one file", st)
	}
}
