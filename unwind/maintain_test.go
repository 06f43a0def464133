package unwind

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testprog"
	"github.com/sonde-profiler/sonde/trace"
)

// fakeKernel stands in for the BPF maps: tables by id, mappings by pid.
type fakeKernel struct {
	mu        sync.Mutex
	tables    map[uint32][]KernelRow
	goRT      map[uint32]KernelGoRuntime
	next      uint32
	maxTables int
	processes map[uint32][]KernelMapping
	execIDs   map[uint32]uint64
	deletes   int // DeleteProcess calls
}

func newFakeKernel(maxTables int) *fakeKernel {
	return &fakeKernel{tables: map[uint32][]KernelRow{}, processes: map[uint32][]KernelMapping{}, execIDs: map[uint32]uint64{}, maxTables: maxTables}
}

func (k *fakeKernel) AddTable(table KernelTable, goRuntime *KernelGoRuntime) (uint32, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.tables) >= k.maxTables {
		return 0, ErrTableFull
	}
	rows, err := tableRows(table) // unmapped once AddTable returns
	if err != nil {
		return 0, err
	}
	k.next++
	k.tables[k.next] = rows
	if goRuntime != nil {
		if k.goRT == nil {
			k.goRT = map[uint32]KernelGoRuntime{}
		}
		k.goRT[k.next] = *goRuntime
	}
	return k.next, nil
}

// tableRows takes a table's rows as the kernel does, holding it to what it said of them.
func tableRows(t KernelTable) ([]KernelRow, error) {
	var rows []KernelRow
	if err := t.Each(func(part []KernelRow) error {
		if len(part) == 0 {
			return fmt.Errorf("an empty part after %d rows", len(rows))
		}
		rows = append(rows, part...)
		return nil
	}); err != nil {
		return nil, err
	}
	if len(rows) != t.Rows || len(rows) > 0 && (rows[0].Pc != t.First || rows[len(rows)-1].Pc != t.Last) {
		return nil, fmt.Errorf("a table said to have %d rows from %#x to %#x has %d", t.Rows, t.First, t.Last, len(rows))
	}
	return rows, nil
}

func (k *fakeKernel) RemoveTable(id uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.tables[id]; !ok {
		return fmt.Errorf("no table %d", id)
	}
	delete(k.tables, id)
	return nil
}

func (k *fakeKernel) SetProcess(pid uint32, execID uint64, m []KernelMapping) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.processes[pid] = append([]KernelMapping(nil), m...)
	k.execIDs[pid] = execID
	return nil
}

func (k *fakeKernel) DeleteProcess(pid uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.processes, pid)
	k.deletes++
	return nil
}

func (k *fakeKernel) process(pid uint32) ([]KernelMapping, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	m, ok := k.processes[pid]
	return m, ok
}

func (k *fakeKernel) tableCount() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.tables)
}

// runMaintainer starts a Maintainer over k and returns it with a function that waits for
// what was queued to be written.
func runMaintainer(t *testing.T, cfg MaintainerConfig) (*Maintainer, func()) {
	t.Helper()
	m := NewMaintainer(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return m, func() { m.Settle(context.Background()) }
}

func buildPIE(t *testing.T) string {
	t.Helper()
	return testprog.BuildC(t, "int f(int x){return x*3;}\nint main(int c,char**v){return f(c);}\n", "-O2", "-fPIE", "-pie")
}

// copyFile puts a copy of src in a directory of its own: another file, another identity
// (the copy keeps the build ID, so identities are set by the test).
func copyFile(t *testing.T, src string) string {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := os.WriteFile(p, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// textMapping maps a gcc PIE's executable segment, which starts at file offset 0x1000,
// address 0x1000, at start.
func textMapping(f *objfile.File, start uint64) *trace.Mapping {
	return &trace.Mapping{Start: start, End: start + 0x1000, Offset: 0x1000, Path: f.Path, File: f}
}

func TestMaintainerSharesTablesAndComputesBias(t *testing.T) {
	bin := buildPIE(t)
	k := newFakeKernel(100)
	var errs []string
	m, settle := runMaintainer(t, MaintainerConfig{Kernel: k, MaxMappings: 4, OnError: func(what string, err error) { errs = append(errs, fmt.Sprint(what, err)) }})
	file := objfile.HostFile(objfile.Key{Dev: 1, Inode: 2}, bin)
	file.GNUBuildID = "feed"
	vdso := &trace.Mapping{Start: 0x7fff0000, End: 0x7fff2000, Path: "[vdso]"}
	m.ProcessMappings(10, 5, []*trace.Mapping{textMapping(file, 0x555555555000), vdso})
	m.ProcessMappings(11, 0, []*trace.Mapping{textMapping(file, 0x566666666000), vdso})
	settle()
	if len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	st := m.Stats()
	if st.Files != 1 || st.Rows == 0 || k.tableCount() != 1 || st.Processes != 2 {
		t.Fatalf("one file's table, shared by two processes: stats %+v, %d tables in kernel", st, k.tableCount())
	}
	for pid, base := range map[uint32]uint64{10: 0x555555554000, 11: 0x566666665000} {
		pm, _ := k.process(pid)
		if len(pm) != 1 {
			t.Fatalf("pid %d: %d mappings, want the file's only (the vDSO walks by frame pointer)", pid, len(pm))
		}
		if pm[0].Bias != base || pm[0].TableId != 1 || int(pm[0].RowsCount) != st.Rows {
			t.Errorf("pid %d mapping %+v, want bias %#x and the shared table", pid, pm[0], base)
		}
	}
	if k.execIDs[10] != 5 {
		t.Errorf("exec id %d written for pid 10, want 5", k.execIDs[10])
	}
	m.ProcessGone(10)
	settle()
	if _, ok := k.process(10); ok {
		t.Error("pid 10 still in the kernel after ProcessGone")
	}
}

// A process the maintainer never wrote costs nothing when it goes: no delete reaches the
// kernel (the kernel drops its own entry at exit). One written is deleted, however close
// its going follows its mappings.
func TestMaintainerGoneUnwritten(t *testing.T) {
	bin := buildPIE(t)
	k := newFakeKernel(100)
	m, settle := runMaintainer(t, MaintainerConfig{Kernel: k, MaxMappings: 4})
	for pid := range uint32(100) {
		m.ProcessGone(1000 + pid)
	}
	settle()
	m.mu.Lock()
	queued := m.queued
	m.mu.Unlock()
	if k.deletes != 0 || queued != 0 {
		t.Errorf("%d deletes and %d updates queued for processes never written", k.deletes, queued)
	}
	file := objfile.HostFile(objfile.Key{Dev: 1, Inode: 2}, bin)
	m.ProcessMappings(10, 1, []*trace.Mapping{textMapping(file, 0x555555555000)})
	settle()
	m.ProcessMappings(11, 1, []*trace.Mapping{textMapping(file, 0x566666666000)})
	m.ProcessGone(11) // queued, not yet written
	m.ProcessGone(10)
	settle()
	for _, pid := range []uint32{10, 11} {
		if _, ok := k.process(pid); ok {
			t.Errorf("pid %d still in the kernel after it went", pid)
		}
	}
	m.ProcessGone(10) // forgotten already
	settle()
	// Pid 11's going replaced its queued mappings unless Run took them up first: either
	// way, one delete for each process written.
	k.mu.Lock()
	defer k.mu.Unlock()
	if written := len(k.execIDs); k.deletes != written {
		t.Errorf("%d deletes for %d processes written", k.deletes, written)
	}
}

// Tables of files no process maps any more are freed when a new file needs the room, and
// reused while they stay: the budget bounds the kernel's memory whatever runs.
func TestMaintainerReclaimsTables(t *testing.T) {
	bin := buildPIE(t)
	rows := func() int {
		f, err := os.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		tab, err := Read(f)
		if err != nil {
			t.Fatal(err)
		}
		return len(tab.Rows)
	}()
	k := newFakeKernel(100)
	var reports int
	m, settle := runMaintainer(t, MaintainerConfig{Kernel: k, MaxMappings: 4, MaxRows: 2 * rows, OnError: func(string, error) { reports++ }})
	files := make([]*objfile.File, 4)
	for i := range files {
		files[i] = objfile.HostFile(objfile.Key{Dev: 1, Inode: uint64(100 + i)}, copyFile(t, bin))
		files[i].GNUBuildID = fmt.Sprintf("%02d", i)
	}
	// Two programs fill the budget; a third cannot fit while they run.
	m.ProcessMappings(1, 0, []*trace.Mapping{textMapping(files[0], 0x1000)})
	m.ProcessMappings(2, 0, []*trace.Mapping{textMapping(files[1], 0x1000)})
	m.ProcessMappings(3, 0, []*trace.Mapping{textMapping(files[2], 0x1000)})
	settle()
	if pm, _ := k.process(3); len(pm) != 1 || pm[0].RowsCount != 0 {
		t.Fatalf("third program over budget: %+v, want a frame-pointer mapping", pm)
	}
	if st := m.Stats(); st.FilesOverflow != 1 || reports != 1 || st.Rows != 2*rows {
		t.Fatalf("stats %+v with %d reports; want one file overflowing, reported once", st, reports)
	}
	// The first program exits: its table stays while nothing needs the room...
	m.ProcessGone(1)
	settle()
	if k.tableCount() != 2 {
		t.Fatalf("%d tables after an exit, want 2: an idle table stays until room is needed", k.tableCount())
	}
	// ...and goes when a new program needs it; the overflowed file gets its table then.
	m.ProcessMappings(3, 0, []*trace.Mapping{textMapping(files[2], 0x1000)})
	m.ProcessMappings(4, 0, []*trace.Mapping{textMapping(files[1], 0x2000)})
	settle()
	if pm, _ := k.process(3); len(pm) != 1 || pm[0].RowsCount == 0 {
		t.Errorf("after room was made: %+v, want a table", pm)
	}
	st := m.Stats()
	if st.TablesEvicted != 1 || st.FilesOverflow != 0 || st.Rows != 2*rows || k.tableCount() != 2 {
		t.Errorf("stats %+v, %d tables; want one eviction and the budget kept", st, k.tableCount())
	}
	// A file shared by a running program is never evicted for another.
	m.ProcessMappings(5, 0, []*trace.Mapping{textMapping(files[3], 0x1000)})
	settle()
	if pm, _ := k.process(5); len(pm) != 1 || pm[0].RowsCount != 0 {
		t.Errorf("no idle table to evict: %+v, want a frame-pointer mapping", pm)
	}
	for pid := uint32(2); pid <= 4; pid++ {
		if pm, _ := k.process(pid); len(pm) != 1 || pm[0].RowsCount == 0 {
			t.Errorf("pid %d lost its table to a newcomer: %+v", pid, pm)
		}
	}
}

func TestMaintainerTableSlotsFullFallsBack(t *testing.T) {
	bin := buildPIE(t)
	k := newFakeKernel(0)
	var errs int
	m, settle := runMaintainer(t, MaintainerConfig{Kernel: k, MaxMappings: 256, OnError: func(string, error) { errs++ }})
	for i := range 3 {
		f := objfile.HostFile(objfile.Key{Dev: 1, Inode: uint64(i)}, bin)
		m.ProcessMappings(uint32(i), 0, []*trace.Mapping{textMapping(f, 0x1000)})
	}
	settle()
	for i := range 3 {
		if pm, _ := k.process(uint32(i)); len(pm) != 1 || pm[0].RowsCount != 0 {
			t.Errorf("pid %d: %+v, want a frame-pointer mapping", i, pm)
		}
	}
	if st := m.Stats(); st.FilesOverflow != 3 || errs != 1 {
		t.Errorf("stats %+v, %d reports; want 3 overflowing files reported once", st, errs)
	}
}

func TestMaintainerMissingFile(t *testing.T) {
	k := newFakeKernel(100)
	var errs int
	m, settle := runMaintainer(t, MaintainerConfig{Kernel: k, MaxMappings: 256, OnError: func(string, error) { errs++ }})
	f := objfile.HostFile(objfile.Key{Dev: 9, Inode: 9}, "/no/such/file")
	for range 2 {
		m.ProcessMappings(1, 0, []*trace.Mapping{{Start: 0x1000, End: 0x2000, Path: "/no/such/file", File: f}})
		settle()
	}
	if st := m.Stats(); st.FilesFailed != 1 || errs != 1 {
		t.Errorf("stats %+v with %d reports; want one failure reported once", st, errs)
	}
	if pm, _ := k.process(1); len(pm) != 1 || pm[0].RowsCount != 0 {
		t.Errorf("mapping of a missing file: %+v", pm)
	}
}
