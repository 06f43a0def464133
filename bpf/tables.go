package bpf

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ErrTableFull: every slot for a file's table is taken, or the kernel refused the memory
// for another one.
var ErrTableFull = errors.New("no room for another unwind table")

// tableSlots hands out indices into the unwind_tables map.
type tableSlots struct {
	free []uint32 // released indices, reused first
	next uint32   // the lowest index never handed out
	max  uint32
}

func (t *tableSlots) take() (uint32, bool) {
	if n := len(t.free); n > 0 {
		id := t.free[n-1]
		t.free = t.free[:n-1]
		return id, true
	}
	if t.next >= t.max {
		return 0, false
	}
	t.next++
	return t.next - 1, true
}

func (t *tableSlots) put(id uint32) { t.free = append(t.free, id) }

// rowBatch is how many unwind rows one map update writes.
const rowBatch = 16384

// Tables of fewer rows than minIndexedRows are searched whole (a few steps, in cache);
// larger ones get an index by page of code (struct row_index) of about one page per
// rowsPerPage rows: at most a thirty-second more kernel memory.
const (
	minIndexedRows = 256
	rowsPerPage    = 8
)

// rowIndexer builds a table's index as its rows go by, in order: it needs only their
// number and the first and last addresses beforehand.
type rowIndexer struct {
	n                   int
	first, pages, shift uint32
	k                   uint32 // the first page whose entry is not known yet
	slot                [4]uint32
	index               []UnwindRow
}

// newRowIndexer is nil for a table searched whole.
func newRowIndexer(n int, first, last uint32) *rowIndexer {
	if n < minIndexedRows || last < first {
		return nil
	}
	span := last - first
	shift := uint32(0)
	for span>>shift+1 > uint32(n/rowsPerPage) {
		shift++
	}
	x := &rowIndexer{n: n, first: first >> shift, pages: span>>shift + 1, shift: shift}
	x.index = make([]UnwindRow, 1, x.len())
	x.index[0] = asRow([4]uint32{x.first, x.pages, shift, 0})
	return x
}

// len is the index's size in rows: its header and four entries a row.
func (x *rowIndexer) len() int {
	if x == nil {
		return 0
	}
	return 1 + int(x.pages+1+3)/4
}

// add takes rows at indices at, at+1, ... Entry k is the row in effect at page k's start
// (the last whose pc is at most it), 0 where none is, before the first row: a page's
// entry is known once a row past its start goes by.
func (x *rowIndexer) add(at int, rows []UnwindRow) {
	if x == nil {
		return
	}
	for i, r := range rows {
		for x.k <= x.pages && uint64(x.first+x.k)<<x.shift < uint64(r.Pc) {
			x.set(max(at+i-1, 0))
		}
	}
}

func (x *rowIndexer) set(row int) {
	x.slot[x.k%4] = uint32(row)
	if x.k%4 == 3 || x.k == x.pages {
		x.index = append(x.index, asRow(x.slot))
		x.slot = [4]uint32{}
	}
	x.k++
}

// finish gives the pages past the last row's start the last row, and returns the index.
func (x *rowIndexer) finish() []UnwindRow {
	if x == nil {
		return nil
	}
	for x.k <= x.pages {
		x.set(x.n - 1)
	}
	return x.index
}

// asRow is a slot of the index in the table's array: four numbers where a row would be.
func asRow(v [4]uint32) UnwindRow {
	return *(*UnwindRow)(unsafe.Pointer(&v))
}

var _ [unsafe.Sizeof(UnwindRow{}) - 16]struct{} // a row is four 32-bit words
var _ [16 - unsafe.Sizeof(UnwindRow{})]struct{}
var _ [unsafe.Sizeof(samplerRowIndex{}) - 16]struct{}

// TableRows is a table on its way to the kernel: its number of rows and the addresses of
// its first and last, known beforehand, and Each, which hands the rows over in pc order,
// in parts valid only for the call that takes them.
type TableRows struct {
	Len         int
	First, Last uint32
	Each        func(part func([]UnwindRow) error) error
}

// AddTable stores one file's rows as a table of their own and returns its id, which
// ExecMapping.TableId refers to. The kernel memory it takes is t.Len rows of 16 bytes
// and their index (rowIndexer, at most a thirty-second more), held until RemoveTable.
// goRuntime, for a Go binary, says where its runtime keeps what
// the walker reads to follow Go's stack switches; nil for other files.
func (s *Sampler) AddTable(t TableRows, goRuntime *GoRuntime) (id uint32, err error) {
	if t.Len <= 0 {
		return 0, errors.New("add unwind table: no rows")
	}
	indexer := newRowIndexer(t.Len, t.First, t.Last)
	s.tablesMu.Lock()
	defer s.tablesMu.Unlock()
	id, ok := s.slots.take()
	if !ok {
		return 0, fmt.Errorf("add unwind table of %d rows: all %d tables in use: %w", t.Len, s.slots.max, ErrTableFull)
	}
	defer func() {
		if err != nil {
			s.slots.put(id)
		}
	}()
	inner, err := ebpf.NewMap(&ebpf.MapSpec{
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  uint32(unsafe.Sizeof(UnwindRow{})),
		MaxEntries: uint32(t.Len + indexer.len()),
		Flags:      unix.BPF_F_INNER_MAP,
	})
	if errors.Is(err, unix.ENOMEM) {
		return 0, fmt.Errorf("add unwind table of %d rows: %w: %w", t.Len, ErrTableFull, err)
	}
	if err != nil {
		return 0, fmt.Errorf("add unwind table of %d rows: %w", t.Len, err)
	}
	// The outer map holds its own reference: the table lives on without this descriptor.
	defer inner.Close()
	// In batches: a large file's table is not copied whole for the syscall.
	keys := make([]uint32, min(t.Len, rowBatch))
	write := func(at int, rows []UnwindRow) error {
		for start := 0; start < len(rows); start += rowBatch {
			batch := rows[start:min(start+rowBatch, len(rows))]
			for i := range batch {
				keys[i] = uint32(at + start + i)
			}
			if _, err := inner.BatchUpdate(keys[:len(batch)], batch, nil); err != nil {
				return err
			}
		}
		return nil
	}
	written := 0
	err = t.Each(func(part []UnwindRow) error {
		if written+len(part) > t.Len {
			return fmt.Errorf("more rows than the %d said", t.Len)
		}
		if err := write(written, part); err != nil {
			return err
		}
		indexer.add(written, part)
		written += len(part)
		return nil
	})
	if err == nil && written != t.Len {
		err = fmt.Errorf("%d rows of the %d said", written, t.Len)
	}
	if err != nil {
		return 0, fmt.Errorf("write %d unwind rows: %w", t.Len, err)
	}
	if err := write(t.Len, indexer.finish()); err != nil {
		return 0, fmt.Errorf("write the index of %d unwind rows: %w", t.Len, err)
	}
	// The layout goes in first: a table is only walked once a mapping names it, and a
	// stale layout of the id's previous file was removed with that file's table.
	if goRuntime != nil {
		if err := s.objs.GoRuntimes.Put(id, goRuntime); err != nil {
			return 0, fmt.Errorf("install go runtime layout of table %d: %w", id, err)
		}
	}
	if err := s.objs.UnwindTables.Put(id, inner); err != nil {
		s.objs.GoRuntimes.Delete(id)
		return 0, fmt.Errorf("install unwind table %d: %w", id, err)
	}
	return id, nil
}

// RemoveTable frees a table; the kernel releases its memory once no running program
// still reads it.
func (s *Sampler) RemoveTable(id uint32) error {
	s.tablesMu.Lock()
	defer s.tablesMu.Unlock()
	if err := s.objs.UnwindTables.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("remove unwind table %d: %w", id, err)
	}
	if err := s.objs.GoRuntimes.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("remove go runtime layout of table %d: %w", id, err)
	}
	s.slots.put(id)
	return nil
}

// SetProcess tells the kernel unwinder a process's executable mappings, sorted by start,
// as read after the exec whose self_exec_id is execID; the kernel ignores them once the
// process execs again. Beyond MaxProcessMappings the rest are walked by frame pointer.
func (s *Sampler) SetProcess(pid uint32, execID uint64, mappings []ExecMapping) error {
	var info samplerProcInfo
	info.ExecId = execID
	info.Count = uint32(copy(info.Maps[:], mappings))
	info.Gen = s.procGen.Add(1)
	if info.Gen == 0 { // after 2^32 writings: 0 is no writing's
		info.Gen = s.procGen.Add(1)
	}
	if err := s.objs.ProcMaps.Put(pid, &info); err != nil {
		return fmt.Errorf("set mappings of pid %d: %w", pid, err)
	}
	return nil
}

// DeleteProcess forgets a process's mappings.
func (s *Sampler) DeleteProcess(pid uint32) error {
	if err := s.objs.ProcMaps.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete mappings of pid %d: %w", pid, err)
	}
	return nil
}

// ExecID returns the self_exec_id of pid's latest exec since the programs were loaded;
// ok is false when pid has not exec'd since (or exited).
func (s *Sampler) ExecID(pid uint32) (id uint64, ok bool, err error) {
	err = s.objs.ExecIds.Lookup(pid, &id)
	switch {
	case err == nil:
		return id, true, nil
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return 0, false, nil
	default:
		return 0, false, fmt.Errorf("look up exec id of pid %d: %w", pid, err)
	}
}

// KernelState counts the per-process and per-file state the kernel holds for the
// unwinder, for tests and the summary: it must follow what runs, not what ran.
type KernelState struct {
	Processes, Tables, GoRuntimes int
}

// KernelState walks the unwinder's maps and counts their entries.
func (s *Sampler) KernelState() (KernelState, error) {
	var st KernelState
	// Keys only: each value is a few kilobytes of mappings.
	var key any
	for {
		var next uint32
		err := s.objs.ProcMaps.NextKey(key, &next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return st, fmt.Errorf("count process mappings: %w", err)
		}
		st.Processes++
		key = next
	}
	key = nil
	for {
		var next uint32
		err := s.objs.GoRuntimes.NextKey(key, &next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return st, fmt.Errorf("count go runtime layouts: %w", err)
		}
		st.GoRuntimes++
		key = next
	}
	s.tablesMu.Lock()
	st.Tables = int(s.slots.next) - len(s.slots.free)
	s.tablesMu.Unlock()
	return st, nil
}
