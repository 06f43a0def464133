package unwind

import (
	"debug/elf"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"

	"github.com/sonde-profiler/sonde/trace"
)

// KernelTables is where tables go for the kernel unwinder: bpf.Sampler behind a small
// adapter in cmd/agent, or a fake in tests.
type KernelTables interface {
	// AddTable stores a file's rows and returns the index of the first.
	AddTable(rows []Row) (first uint32, err error)
	// SetProcess replaces a process's mappings, sorted by Start.
	SetProcess(pid uint32, mappings []ProcessMapping) error
	// DeleteProcess forgets a process.
	DeleteProcess(pid uint32) error
}

// ProcessMapping is an executable mapping as the kernel unwinder sees it.
type ProcessMapping struct {
	Start, End uint64
	// Bias is runtime address minus ELF virtual address.
	Bias uint64
	// RowsFirst and RowsCount locate the file's table; RowsCount 0 means "walk by frame pointer".
	RowsFirst, RowsCount uint32
}

// ErrTableFull is what AddTable returns when the kernel has no room for more rows.
var ErrTableFull = errors.New("unwind table capacity reached")

// MaintainerStats counts what the Maintainer did.
type MaintainerStats struct {
	Files          int // files with a table in the kernel
	Rows           int // rows in the kernel
	FilesNoTable   int // files walked by frame pointer by design: Go binaries, files without frame info
	FilesFailed    int // files whose call frame information could not be read
	FilesOverflow  int // files left to frame pointers because the table map was full
	MappingsCapped int // process mappings beyond the kernel's per-process limit
}

// Maintainer keeps the kernel unwinder's tables and per-process mappings current as the
// collector reads processes' mappings. Each file's table is built once, keyed by the
// file's identity, and shared by every process that maps it.
type Maintainer struct {
	kernel      KernelTables
	maxMappings int
	onError     func(path string, err error)

	mu     sync.Mutex
	tables map[string]*fileTable
	stats  MaintainerStats
	full   bool
}

type fileTable struct {
	first, count uint32
	loads        []elf.ProgHeader // PT_LOAD segments, to turn file offsets into addresses
}

// NewMaintainer writes tables to kernel. maxMappings is how many mappings per process the
// kernel holds; onError hears once per file why it has no table, and once that the table
// map is full.
func NewMaintainer(kernel KernelTables, maxMappings int, onError func(path string, err error)) *Maintainer {
	if onError == nil {
		onError = func(string, error) {}
	}
	return &Maintainer{kernel: kernel, maxMappings: maxMappings, onError: onError, tables: map[string]*fileTable{}}
}

// fileID names a file's content: the build ID where there is one, so copies of a file in
// different containers share a table.
func fileID(f *trace.File) string {
	switch {
	case f.GNUBuildID != "":
		return "gnu:" + f.GNUBuildID
	case f.GoBuildID != "":
		return "go:" + f.GoBuildID
	case f.HTLHash != "":
		return "htl:" + f.HTLHash
	default:
		return fmt.Sprintf("inode:%d:%d", f.Key.Dev, f.Key.Inode)
	}
}

// ProcessMappings implements trace.MappingObserver.
func (m *Maintainer) ProcessMappings(pid uint32, mappings []*trace.Mapping) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]ProcessMapping, 0, len(mappings))
	for _, mp := range mappings {
		if mp.File == nil {
			continue // anonymous code and the vDSO: frame pointers
		}
		pm := ProcessMapping{Start: mp.Start, End: mp.Limit}
		if t := m.table(mp.File); t != nil && t.count > 0 {
			if vaddr, ok := offsetToVaddr(t.loads, mp.Offset); ok {
				pm.Bias = mp.Start - vaddr
				pm.RowsFirst, pm.RowsCount = t.first, t.count
			}
		}
		out = append(out, pm)
	}
	if len(out) > m.maxMappings {
		m.stats.MappingsCapped += len(out) - m.maxMappings
		out = out[:m.maxMappings]
	}
	if err := m.kernel.SetProcess(pid, out); err != nil {
		m.onError(fmt.Sprintf("pid %d", pid), err)
	}
}

// ProcessGone implements trace.MappingObserver.
func (m *Maintainer) ProcessGone(pid uint32) {
	_ = m.kernel.DeleteProcess(pid)
}

// table returns the file's table, building and storing it on first sight; nil when the
// file has none.
func (m *Maintainer) table(f *trace.File) *fileTable {
	id := fileID(f)
	if t, ok := m.tables[id]; ok {
		return t
	}
	t := &fileTable{}
	m.tables[id] = t
	if f.IsGo {
		// Go keeps frame pointers on amd64 and arm64, and its .debug_frame, when not
		// stripped, would cost hundreds of thousands of rows per binary.
		m.stats.FilesNoTable++
		return t
	}
	rows, loads, err := readTable(f)
	if err != nil {
		m.stats.FilesFailed++
		m.onError(f.Path, err)
		return t
	}
	t.loads = loads
	if len(rows) == 0 {
		m.stats.FilesNoTable++
		return t
	}
	if m.full {
		m.stats.FilesOverflow++
		return t
	}
	first, err := m.kernel.AddTable(rows)
	if errors.Is(err, ErrTableFull) {
		m.full = true
		m.stats.FilesOverflow++
		m.onError(f.Path, fmt.Errorf("%w: this and later files are walked by frame pointer; raise --unwind-rows", err))
		return t
	}
	if err != nil {
		m.stats.FilesFailed++
		m.onError(f.Path, err)
		return t
	}
	t.first, t.count = first, uint32(len(rows))
	m.stats.Files++
	m.stats.Rows += len(rows)
	return t
}

// readTable reads a file's unwind rows and load segments. Rows beyond 4 GiB of virtual
// address space cannot be stored in the kernel's 32-bit row addresses: such files walk by
// frame pointer.
func readTable(f *trace.File) ([]Row, []elf.ProgHeader, error) {
	file, err := f.Open()
	if err != nil {
		return nil, nil, err
	}
	defer file.Close()
	ef, err := safeELF(file)
	if err != nil {
		return nil, nil, fmt.Errorf("read unwind table of %s: %w", f.Path, err)
	}
	var loads []elf.ProgHeader
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			loads = append(loads, p.ProgHeader)
		}
	}
	// A file without section headers may still have PT_GNU_EH_FRAME, which FromELF reads.
	if len(ef.Sections) > 0 && ef.Section(".eh_frame") == nil && ef.Section(".debug_frame") == nil {
		return nil, loads, nil // nothing to unwind by: frame pointers
	}
	t, err := FromELF(ef)
	if err != nil {
		return nil, loads, fmt.Errorf("read unwind table of %s: %w", f.Path, err)
	}
	if n := len(t.Rows); n > 0 && t.Rows[n-1].PC > math.MaxUint32 {
		return nil, loads, fmt.Errorf("read unwind table of %s: code above 4 GiB of address space", f.Path)
	}
	return t.Rows, loads, nil
}

func safeELF(file *os.File) (ef *elf.File, err error) {
	defer func() {
		if p := recover(); p != nil {
			ef, err = nil, fmt.Errorf("malformed elf: %v", p)
		}
	}()
	return elf.NewFile(file)
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
	return m.stats
}
