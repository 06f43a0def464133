package symbolize

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testprog"
	"github.com/sonde-profiler/sonde/trace"
)

// A file truncated while the symbolizer has it mapped: the lookups that touch the
// pages past its new end fault, the fault is an error for that file, the file is
// dropped and unmapped, and the agent lives on; once the file is whole again it is
// read afresh.
func TestSymbolizerFileTruncatedWhileMapped(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bin   string
		isGo  bool
		count int
	}{
		{"go", testprog.BuildGo(t, testprog.GoInlining), true, 200},
		{"c-dwarf", buildC(t, testProgram, pieArgs...), false, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig, err := os.ReadFile(tc.bin)
			if err != nil {
				t.Fatal(err)
			}
			victim := filepath.Join(t.TempDir(), "victim")
			if err := os.WriteFile(victim, orig, 0o755); err != nil {
				t.Fatal(err)
			}
			m := wholeFile(t, victim, objfile.Key{Dev: 1, Inode: 300})
			m.File.IsGo = tc.isGo
			locs := locationsAt(t, m, spreadText(t, victim, tc.count))
			half := len(locs) / 2
			// No address cache: every location is looked up in the file.
			s := New(Options{AddressCacheSize: -1})
			if errs := s.Symbolize(&trace.Profile{Locations: locs[:half]}); len(errs) != 0 {
				t.Fatal(errs)
			}
			if countNamedT(locs[:half]) == 0 {
				t.Fatal("nothing named before the truncation")
			}

			if err := os.Truncate(victim, 4096); err != nil {
				t.Fatal(err)
			}
			errs := s.Symbolize(&trace.Profile{Locations: locs[half:]})
			if len(errs) != 1 || !errors.Is(errs[0], mmapfile.ErrFault) {
				t.Fatalf("after the truncation: errors %v, want one fault", errs)
			}
			st := s.Stats()
			if st.FilesFaulted != 1 || st.CachedFiles != 0 {
				t.Errorf("after the fault: %+v, want the file dropped", st)
			}

			if err := os.WriteFile(victim, orig, 0o755); err != nil {
				t.Fatal(err)
			}
			reset(locs)
			if errs := s.Symbolize(&trace.Profile{Locations: locs}); len(errs) != 0 {
				t.Fatalf("the file whole again: %v", errs)
			}
			if n := countNamedT(locs); n < len(locs)/2 {
				t.Errorf("the file whole again: %d of %d named", n, len(locs))
			}
			if st := s.Stats(); st.FilesLoaded != 2 || st.FilesFaulted != 1 {
				t.Errorf("the file whole again: %+v, want it read a second time", st)
			}
		})
	}
}

func countNamedT(locs []*trace.Location) (n int) {
	for _, l := range locs {
		if len(l.Lines) > 0 {
			n++
		}
	}
	return n
}
