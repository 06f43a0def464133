package unwind

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/trace"
)

type fakeKernel struct {
	rows      []Row
	processes map[uint32][]ProcessMapping
	capacity  int
}

func (k *fakeKernel) AddTable(rows []Row) (uint32, error) {
	if len(k.rows)+len(rows) > k.capacity {
		return 0, ErrTableFull
	}
	first := uint32(len(k.rows))
	k.rows = append(k.rows, rows...)
	return first, nil
}

func (k *fakeKernel) SetProcess(pid uint32, m []ProcessMapping) error {
	k.processes[pid] = append([]ProcessMapping(nil), m...)
	return nil
}

func (k *fakeKernel) DeleteProcess(pid uint32) error {
	delete(k.processes, pid)
	return nil
}

func buildPIE(t *testing.T) string {
	t.Helper()
	gcc := testenv.RequireTool(t, "gcc")
	dir := t.TempDir()
	src := filepath.Join(dir, "p.c")
	os.WriteFile(src, []byte("int f(int x){return x*3;}\nint main(int c,char**v){return f(c);}\n"), 0o644)
	bin := filepath.Join(dir, "p")
	if out, err := exec.Command(gcc, "-O2", "-fPIE", "-pie", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
}

func TestMaintainerSharesTablesAndComputesBias(t *testing.T) {
	bin := buildPIE(t)
	k := &fakeKernel{processes: map[uint32][]ProcessMapping{}, capacity: 1 << 20}
	var errs []string
	m := NewMaintainer(k, 4, func(what string, err error) { errs = append(errs, fmt.Sprint(what, err)) })
	file := trace.NewFile(trace.FileKey{Dev: 1, Inode: 2}, bin, bin)
	file.GNUBuildID = "feed"
	// The executable segment of a gcc PIE starts at file offset 0x1000, address 0x1000.
	text := func(start uint64) []*trace.Mapping {
		return []*trace.Mapping{
			{Start: start, Limit: start + 0x1000, Offset: 0x1000, Path: bin, File: file},
			{Start: 0x7fff0000, Limit: 0x7fff2000, Path: "[vdso]"},
		}
	}
	m.ProcessMappings(10, text(0x555555555000))
	m.ProcessMappings(11, text(0x566666666000))
	if len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	st := m.Stats()
	if st.Files != 1 || st.Rows == 0 || st.Rows != len(k.rows) {
		t.Fatalf("one file's table, shared: stats %+v, %d rows in kernel", st, len(k.rows))
	}
	for pid, base := range map[uint32]uint64{10: 0x555555554000, 11: 0x566666665000} {
		pm := k.processes[pid]
		if len(pm) != 1 {
			t.Fatalf("pid %d: %d mappings, want the file's only (the vDSO walks by frame pointer)", pid, len(pm))
		}
		if pm[0].Bias != base || pm[0].RowsFirst != 0 || int(pm[0].RowsCount) != len(k.rows) {
			t.Errorf("pid %d mapping %+v, want bias %#x", pid, pm[0], base)
		}
	}
	m.ProcessGone(10)
	if _, ok := k.processes[10]; ok {
		t.Error("pid 10 still in the kernel after ProcessGone")
	}
}

func TestMaintainerTableFullFallsBack(t *testing.T) {
	bin := buildPIE(t)
	k := &fakeKernel{processes: map[uint32][]ProcessMapping{}, capacity: 1}
	var errs int
	m := NewMaintainer(k, 256, func(string, error) { errs++ })
	for i := range 3 {
		f := trace.NewFile(trace.FileKey{Dev: 1, Inode: uint64(i)}, bin, bin)
		m.ProcessMappings(uint32(i), []*trace.Mapping{{Start: 0x1000, Limit: 0x2000, Offset: 0x1000, Path: bin, File: f}})
		if pm := k.processes[uint32(i)]; len(pm) != 1 || pm[0].RowsCount != 0 {
			t.Errorf("pid %d: %+v, want a frame-pointer mapping", i, pm)
		}
	}
	if st := m.Stats(); st.FilesOverflow != 3 || errs != 1 {
		t.Errorf("stats %+v, %d reports; want 3 overflowing files reported once", st, errs)
	}
}

func TestMaintainerMissingFile(t *testing.T) {
	k := &fakeKernel{processes: map[uint32][]ProcessMapping{}, capacity: 100}
	var errs int
	m := NewMaintainer(k, 256, func(string, error) { errs++ })
	f := trace.NewFile(trace.FileKey{Dev: 9, Inode: 9}, "/no/such/file")
	for range 2 {
		m.ProcessMappings(1, []*trace.Mapping{{Start: 0x1000, Limit: 0x2000, Path: "/no/such/file", File: f}})
	}
	if st := m.Stats(); st.FilesFailed != 1 || errs != 1 {
		t.Errorf("stats %+v with %d reports; want one failure reported once", st, errs)
	}
	if pm := k.processes[1]; len(pm) != 1 || pm[0].RowsCount != 0 {
		t.Errorf("mapping of a missing file: %+v", pm)
	}
}
