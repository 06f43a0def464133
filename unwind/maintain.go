package unwind

import (
	"container/list"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

// KernelTables is where tables go for the kernel unwinder: bpf.Sampler behind a small
// adapter in cmd/agent, or a fake in tests.
type KernelTables interface {
	// AddTable stores a file's table as a table of its own and returns its id; goRuntime,
	// for a Go binary, is its runtime's layout, stored and removed with the table. The
	// table's rows are read from a file unmapped when it returns: what it keeps, it copies.
	AddTable(table KernelTable, goRuntime *KernelGoRuntime) (id uint32, err error)
	// RemoveTable frees a table.
	RemoveTable(id uint32) error
	// SetProcess replaces a process's mappings, sorted by Start, as read after the exec
	// execID (0: unknown).
	SetProcess(pid uint32, execID uint64, mappings []KernelMapping) error
	// DeleteProcess forgets a process.
	DeleteProcess(pid uint32) error
}

// ErrTableFull is what AddTable returns when the kernel has no room for another table.
var ErrTableFull = errors.New("unwind table capacity reached")

// MaintainerConfig configures a Maintainer.
type MaintainerConfig struct {
	Kernel KernelTables
	// MaxMappings is how many mappings per process the kernel holds.
	MaxMappings int
	// MaxRows bounds the rows all tables in the kernel hold together; 0 means
	// DefaultMaxRows. Tables no process maps are evicted, least recently used first, to
	// make room; a table that still does not fit leaves its file to frame pointers.
	MaxRows int
	// MaxPending bounds the process updates waiting to be written; 0 means 4096.
	MaxPending int
	// OnError hears once per file why it has no table, and when the budget first runs out.
	OnError func(what string, err error)
	// Read, when set, hears after a process's mappings are written how many rows were
	// read from files for it, the rows let go by then: cmd/agent gives a large table's
	// memory back to the system at once rather than at the collection after.
	Read func(rows int)
	// Goroutines, when set, is given each Go binary whose table goes to the kernel, with
	// where its goroutines park and run again, while the table stays there. Its failures
	// are counted (GoProbeErrors), and are its to report.
	Goroutines GoroutineProbes
	// FramePointerCode find the code of a file that keeps frame pointers but has no call
	// frame information by design (a language runtime's builtins compiled into it): its
	// table walks that code by frame pointer, where it would otherwise end the walk for
	// want of a row.
	FramePointerCode []FramePointerCodeFunc
}

// GoroutineProbes follows where a Go binary's goroutines wait (off-CPU profiles by
// goroutine): bpf.Sampler's uprobes behind an adapter in cmd/agent, or a fake in tests.
type GoroutineProbes interface {
	// AttachGoroutines starts following the goroutines of the processes running f;
	// closing what it returns stops.
	AttachGoroutines(f *objfile.File, at GoProbes) (io.Closer, error)
}

// DefaultMaxRows holds the tables of a busy host's few hundred distinct libraries and
// binaries: 4 Mi rows, 64 MiB of kernel memory at 16 bytes a row.
const DefaultMaxRows = 4 << 20

// MaintainerStats counts what the Maintainer did.
type MaintainerStats struct {
	Files          int    // files with a table in the kernel now
	Rows           int    // rows in the kernel now
	RowsBudget     int    // MaxRows
	FilesNoTable   int    // files walked by frame pointer by design: files without frame info, Go before 1.18
	FilesFailed    uint64 // files whose call frame information could not be read
	FilesOverflow  int    // files left to frame pointers now because the budget was spent
	TablesEvicted  uint64 // tables freed because no process mapped their file any more
	MappingsCapped uint64 // process mappings beyond the kernel's per-process limit
	Processes      int    // processes whose mappings the kernel holds now
	// UpdatesDropped counts process updates lost to a full queue: those processes walk by
	// frame pointer until their mappings are read again.
	UpdatesDropped uint64
	Pending        int // updates waiting now
	// GoProbes counts the Go binaries whose goroutines are followed now (Goroutines);
	// GoProbeErrors, the binaries that could not be.
	GoProbes      int
	GoProbeErrors uint64
}

// failureRetryInterval is how long a file whose table could not be read stays failed: it
// may have been unreadable only through the process that exited before it was opened.
const failureRetryInterval = time.Minute

// Maintainer keeps the kernel unwinder's tables and per-process mappings current as
// processes' mappings are read. Updates are queued and written by Run, on a goroutine of
// its own, because building the table of a large binary takes a while. Each file's table
// is built once, keyed by the file's identity, shared by every process that maps it, and
// counted: when no process maps a file any more its table stays while there is room and
// is freed, least recently used first, when a new table needs the room.
type Maintainer struct {
	cfg MaintainerConfig

	mu      sync.Mutex
	queue   []uint32 // pids with pending updates, oldest first
	updates map[uint32]*update
	// inKernel holds the pids whose mappings Run took up to write, until it forgets them.
	inKernel map[uint32]bool
	stats    MaintainerStats
	wake     chan struct{}
	stopped  bool   // Run returned
	queued   uint64 // updates queued so far
	written  uint64 // updates written so far
	settled  *sync.Cond

	// Owned by Run.
	tables  map[objfile.ID]*fileTable
	procs   map[uint32][]*fileTable // the tables each process's mappings hold
	idle    *list.List              // tables in the kernel that no process holds, least recent first
	rows    int
	overrun bool // the budget ran out since the last time a table fit
	// rowsRead counts the rows read from files for the process being applied.
	rowsRead int
}

// update is the latest news of one process.
type update struct {
	execID   uint64
	mappings []*trace.Mapping
	gone     bool
}

// fileTable is what the Maintainer knows of one file's table.
type fileTable struct {
	id       objfile.ID
	state    tableState
	kernelID uint32
	rows     int              // rows the table has, known once built
	loads    []elf.ProgHeader // PT_LOAD segments, to turn file offsets into addresses
	refs     int              // processes whose mappings hold the table
	idleAt   *list.Element    // in idle while unreferenced and in the kernel
	failedAt time.Time
	probes   io.Closer // Goroutines' probes of a Go binary, while its table is in the kernel
}

type tableState uint8

const (
	tableNew      tableState = iota
	tableKernel              // in the kernel
	tableNone                // walked by frame pointer by design
	tableFailed              // could not be read
	tableOverflow            // did not fit in the budget
)

// NewMaintainer returns a Maintainer writing to cfg.Kernel once Run runs.
func NewMaintainer(cfg MaintainerConfig) *Maintainer {
	if cfg.OnError == nil {
		cfg.OnError = func(string, error) {}
	}
	if cfg.MaxRows <= 0 {
		cfg.MaxRows = DefaultMaxRows
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = 4096
	}
	m := &Maintainer{
		cfg:      cfg,
		updates:  map[uint32]*update{},
		inKernel: map[uint32]bool{},
		wake:     make(chan struct{}, 1),
		tables:   map[objfile.ID]*fileTable{},
		procs:    map[uint32][]*fileTable{},
		idle:     list.New(),
		stats:    MaintainerStats{RowsBudget: cfg.MaxRows},
	}
	m.settled = sync.NewCond(&m.mu)
	return m
}

// ProcessMappings queues a process's new mappings; it implements trace.MappingObserver
// and never waits for a table to be built.
func (m *Maintainer) ProcessMappings(pid uint32, execID uint64, mappings []*trace.Mapping) {
	m.enqueue(pid, &update{execID: execID, mappings: mappings})
}

// ProcessGone queues forgetting a process; it implements trace.MappingObserver.
func (m *Maintainer) ProcessGone(pid uint32) {
	// A process the maintainer never wrote, nor has an update queued for, left nothing
	// in the kernel to take back (the kernel drops its own entry at exit): most of an
	// exec storm's processes, each of which cost a wake-up and a failing delete.
	m.mu.Lock()
	_, queued := m.updates[pid]
	known := queued || m.inKernel[pid]
	m.mu.Unlock()
	if known {
		m.enqueue(pid, &update{gone: true})
	}
}

func (m *Maintainer) enqueue(pid uint32, u *update) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, queued := m.updates[pid]; queued {
		m.updates[pid] = u // only the latest matters
		return
	}
	if len(m.queue) >= m.cfg.MaxPending {
		m.stats.UpdatesDropped++
		return
	}
	m.updates[pid] = u
	m.queue = append(m.queue, pid)
	m.queued++
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Run writes queued updates to the kernel until ctx ends.
func (m *Maintainer) Run(ctx context.Context) error {
	defer func() {
		m.mu.Lock()
		m.stopped = true
		m.settled.Broadcast()
		m.mu.Unlock()
	}()
	for {
		m.mu.Lock()
		if len(m.queue) == 0 {
			m.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil
			case <-m.wake:
			}
			continue
		}
		pid := m.queue[0]
		m.queue = m.queue[1:]
		u := m.updates[pid]
		delete(m.updates, pid)
		if !u.gone {
			// Marked before the write: a process that goes while it is written is
			// known to ProcessGone, which queues its removal.
			m.inKernel[pid] = true
		}
		m.mu.Unlock()
		if u.gone {
			m.forget(pid)
		} else {
			m.apply(pid, u)
		}
		m.mu.Lock()
		m.written++
		m.settled.Broadcast()
		m.mu.Unlock()
	}
}

// Settle waits until the updates queued before the call are written, their tables
// built, or ctx ends. Tests and start-up use it; Run must be running.
func (m *Maintainer) Settle(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() {
		m.mu.Lock()
		m.settled.Broadcast()
		m.mu.Unlock()
	})
	defer stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	// An update coalesced into one already queued counted once.
	target := m.queued
	for m.written < target && ctx.Err() == nil && !m.stopped {
		m.settled.Wait()
	}
}

// apply writes a process's mappings and the tables of the files they map.
func (m *Maintainer) apply(pid uint32, u *update) {
	out := make([]KernelMapping, 0, len(u.mappings))
	held := make([]*fileTable, 0, len(u.mappings))
	for _, mp := range u.mappings {
		if mp.File == nil {
			continue // anonymous code and the vDSO: frame pointers
		}
		km := KernelMapping{Start: mp.Start, End: mp.End}
		t := m.table(mp.File)
		if t.state == tableKernel {
			if vaddr, ok := offsetToVaddr(t.loads, mp.Offset); ok {
				km.Bias = mp.Start - vaddr
				km.TableId, km.RowsCount = t.kernelID, uint32(t.rows)
				// Held at once, so that making room for a later file cannot evict it.
				m.hold(t)
				held = append(held, t)
			}
		}
		out = append(out, km)
	}
	if len(out) > m.cfg.MaxMappings {
		m.count(func(s *MaintainerStats) { s.MappingsCapped += uint64(len(out) - m.cfg.MaxMappings) })
		out = out[:m.cfg.MaxMappings]
	}
	m.release(m.procs[pid])
	m.procs[pid] = held
	if err := m.cfg.Kernel.SetProcess(pid, u.execID, out); err != nil {
		m.cfg.OnError(fmt.Sprintf("pid %d", pid), err)
	}
	m.publish()
	if read := m.rowsRead; read > 0 && m.cfg.Read != nil {
		m.rowsRead = 0
		m.cfg.Read(read)
	}
}

// forget drops a process and its hold on its tables.
func (m *Maintainer) forget(pid uint32) {
	m.mu.Lock()
	delete(m.inKernel, pid)
	m.mu.Unlock()
	held, written := m.procs[pid]
	if !written {
		return // its update was queued, and replaced before it was written
	}
	m.release(held)
	delete(m.procs, pid)
	_ = m.cfg.Kernel.DeleteProcess(pid)
	m.publish()
}

func (m *Maintainer) hold(t *fileTable) {
	if t.refs++; t.idleAt != nil {
		m.idle.Remove(t.idleAt)
		t.idleAt = nil
	}
}

func (m *Maintainer) release(ts []*fileTable) {
	for _, t := range ts {
		if t.refs--; t.refs == 0 && t.state == tableKernel {
			t.idleAt = m.idle.PushBack(t)
		}
	}
}

// table returns the file's table, building it and storing it in the kernel on first
// sight, or again once a failure is old or the budget has room for a file that overflowed.
func (m *Maintainer) table(f *objfile.File) *fileTable {
	id := f.ID()
	t, ok := m.tables[id]
	if !ok {
		t = &fileTable{id: id}
		m.tables[id] = t
	}
	switch t.state {
	case tableKernel, tableNone:
		return t
	case tableFailed:
		if time.Since(t.failedAt) < failureRetryInterval {
			return t
		}
	case tableOverflow:
		if !m.canFit(t.rows) {
			return t
		}
	}
	table, loads, goRT, probes, release, err := readTable(f, m.cfg.FramePointerCode)
	defer release() // after AddTable has taken the rows
	m.rowsRead += table.Rows
	t.loads = loads
	switch {
	case err != nil:
		if t.state != tableFailed {
			m.count(func(s *MaintainerStats) { s.FilesFailed++ })
			m.cfg.OnError(f.Path, err)
		}
		t.state, t.failedAt = tableFailed, time.Now()
		return t
	case table.Rows == 0:
		t.state = tableNone
		return t
	}
	t.rows = table.Rows
	if !m.makeRoom(table.Rows) {
		m.overflow(t, f.Path, fmt.Errorf("%w: %d rows needed, %d of %d in use", ErrTableFull, table.Rows, m.rows, m.cfg.MaxRows))
		return t
	}
	kid, err := m.cfg.Kernel.AddTable(table, goRT)
	if errors.Is(err, ErrTableFull) && m.evictOne() {
		kid, err = m.cfg.Kernel.AddTable(table, goRT)
	}
	if errors.Is(err, ErrTableFull) {
		m.overflow(t, f.Path, err)
		return t
	}
	if err != nil {
		m.count(func(s *MaintainerStats) { s.FilesFailed++ })
		m.cfg.OnError(f.Path, err)
		t.state, t.failedAt = tableFailed, time.Now()
		return t
	}
	t.state, t.kernelID = tableKernel, kid
	m.rows += table.Rows
	m.overrun = false
	if m.cfg.Goroutines != nil && probes.Park != 0 && probes.Execute != 0 {
		c, err := m.cfg.Goroutines.AttachGoroutines(f, probes)
		if err != nil {
			m.count(func(s *MaintainerStats) { s.GoProbeErrors++ })
		} else {
			t.probes = c
			m.count(func(s *MaintainerStats) { s.GoProbes++ })
		}
	}
	return t
}

func (m *Maintainer) overflow(t *fileTable, path string, err error) {
	t.state = tableOverflow
	if !m.overrun {
		m.overrun = true
		m.cfg.OnError(path, fmt.Errorf("%w: this file and others are walked by frame pointer until tables of exited programs make room; raise --unwind-rows or --memory-limit", err))
	}
}

// canFit reports whether rows could fit once every idle table is evicted.
func (m *Maintainer) canFit(rows int) bool {
	free := m.cfg.MaxRows - m.rows
	for e := m.idle.Front(); e != nil && free < rows; e = e.Next() {
		free += e.Value.(*fileTable).rows
	}
	return free >= rows
}

// makeRoom evicts idle tables until rows more fit in the budget; it evicts nothing when
// even that would not be enough.
func (m *Maintainer) makeRoom(rows int) bool {
	if !m.canFit(rows) {
		return false
	}
	for m.rows+rows > m.cfg.MaxRows {
		m.evictOne()
	}
	return true
}

// evictOne frees the least recently used idle table.
func (m *Maintainer) evictOne() bool {
	e := m.idle.Front()
	if e == nil {
		return false
	}
	t := m.idle.Remove(e).(*fileTable)
	t.idleAt = nil
	if t.probes != nil {
		t.probes.Close()
		t.probes = nil
		m.count(func(s *MaintainerStats) { s.GoProbes-- })
	}
	if err := m.cfg.Kernel.RemoveTable(t.kernelID); err != nil {
		m.cfg.OnError("unwind table of "+t.id.String(), err)
	}
	m.rows -= t.rows
	delete(m.tables, t.id)
	m.count(func(s *MaintainerStats) { s.TablesEvicted++ })
	return true
}

func (m *Maintainer) count(f func(*MaintainerStats)) {
	m.mu.Lock()
	f(&m.stats)
	m.mu.Unlock()
}

// publish copies what Run owns into the stats others read.
func (m *Maintainer) publish() {
	files, noTable, overflow := 0, 0, 0
	for _, t := range m.tables {
		switch t.state {
		case tableKernel:
			files++
		case tableNone:
			noTable++
		case tableOverflow:
			overflow++
		}
	}
	m.mu.Lock()
	m.stats.Files, m.stats.Rows, m.stats.FilesNoTable, m.stats.FilesOverflow, m.stats.Processes = files, m.rows, noTable, overflow, len(m.procs)
	m.mu.Unlock()
}

// readTable reads a file's unwind table, as the kernel takes it, its load segments, and
// for a Go binary its runtime's layout and where its goroutines park and run. The table's
// rows are built from the mapped file as the kernel takes them: release, called whatever
// the error, unmaps the file once the kernel has them.
func readTable(f *objfile.File, fpCode []FramePointerCodeFunc) (table KernelTable, loads []elf.ProgHeader, layout *KernelGoRuntime, probes GoProbes, release func(), err error) {
	release = func() {}
	h, err := f.Open()
	if err != nil {
		return KernelTable{}, nil, nil, probes, release, err
	}
	// The sections are read in place: a big binary's pclntab or .eh_frame would
	// otherwise be copied to the heap whole, for a moment, and the agent's peak memory
	// is what a node must provision for.
	ef, region, err := h.MapELF()
	if err != nil {
		h.Close()
		return KernelTable{}, nil, nil, probes, release, fmt.Errorf("read unwind table: %w", err)
	}
	release = func() {
		region.Close()
		h.Close()
	}
	if fault := mmapfile.Guard(func() { table, loads, layout, probes, err = tableOf(f, ef, h, fpCode, region.Release) }); fault != nil {
		return KernelTable{}, nil, nil, GoProbes{}, release, fmt.Errorf("read unwind table of %s: %w", f.Path, fault)
	}
	return table, loads, layout, probes, release, err
}

// tableOf reads what readTable returns from the mapped file ef; release gives back pages
// of the mapping.
func tableOf(f *objfile.File, ef *elf.File, h *objfile.Handle, fpCode []FramePointerCodeFunc, release func([]byte)) (KernelTable, []elf.ProgHeader, *KernelGoRuntime, GoProbes, error) {
	var loads []elf.ProgHeader
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			loads = append(loads, p.ProgHeader)
		}
	}
	switch {
	case f.IsGo:
		// Go code keeps frame pointers; its .debug_frame, when not stripped, would cost
		// hundreds of thousands of rows per binary. The table holds what frame pointers
		// miss: the runtime's switches between stacks, and cgo's C code.
		g, err := ReadGoRuntime(ef, h)
		if errors.Is(err, errNoPclntab) {
			return KernelTable{}, loads, nil, GoProbes{}, nil // a Go release before 1.18: frame pointers
		}
		if err != nil {
			return KernelTable{}, loads, nil, GoProbes{}, fmt.Errorf("read go runtime of %s: %w", f.Path, err)
		}
		t, err := goTable(ef, g)
		if err != nil {
			return KernelTable{}, loads, nil, GoProbes{}, fmt.Errorf("read unwind table of %s: %w", f.Path, err)
		}
		rows, err := t.KernelRows()
		if err != nil {
			return KernelTable{}, loads, nil, GoProbes{}, fmt.Errorf("read unwind table of %s: %w", f.Path, err)
		}
		return KernelTableOf(rows), loads, g.Layout, g.Probes, nil
	case len(ef.Sections) > 0 && ef.Section(".eh_frame") == nil && ef.Section(".debug_frame") == nil:
		// A file without section headers may still have PT_GNU_EH_FRAME, which
		// frameSourceOf reads.
		return KernelTable{}, loads, nil, GoProbes{}, nil // nothing to unwind by: frame pointers
	default:
		t, err := streamELF(ef, fpCode, release)
		if err != nil {
			return KernelTable{}, loads, nil, GoProbes{}, fmt.Errorf("read unwind table of %s: %w", f.Path, err)
		}
		return t.kernel(), loads, nil, GoProbes{}, nil
	}
}

// offsetToVaddr maps a file offset to the virtual address the loader puts it at.
func offsetToVaddr(loads []elf.ProgHeader, off uint64) (uint64, bool) {
	for _, p := range loads {
		if off >= p.Off && off < p.Off+p.Filesz {
			return p.Vaddr + (off - p.Off), true
		}
	}
	return 0, false
}

// Stats returns the counts so far.
func (m *Maintainer) Stats() MaintainerStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.stats
	st.Pending = len(m.queue)
	return st
}

func (s MaintainerStats) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int("files", s.Files), slog.Int("rows", s.Rows), slog.Int("rows_budget", s.RowsBudget), slog.Int("processes", s.Processes),
		slog.Int("files_fp", s.FilesNoTable), slog.Uint64("files_failed", s.FilesFailed), slog.Int("files_overflow", s.FilesOverflow),
		slog.Uint64("tables_evicted", s.TablesEvicted), slog.Uint64("mappings_capped", s.MappingsCapped), slog.Uint64("updates_dropped", s.UpdatesDropped),
		slog.Int("go_probes", s.GoProbes), slog.Uint64("go_probe_errors", s.GoProbeErrors))
}
