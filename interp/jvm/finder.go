package jvm

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

// FinderStats counts what a Finder did.
type FinderStats struct {
	FilesInspected int    // libjvm.so files looked at
	HotSpots       int    // of which HotSpot with its serviceability tables
	Unsupported    int    // of which files sonde cannot read HotSpot in
	Attached       uint64 // processes whose tables were read
	AttachErrors   uint64 // processes whose tables could not be read, or lack a field
}

func (s FinderStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Int("files_inspected", s.FilesInspected), slog.Int("hotspots", s.HotSpots),
		slog.Int("unsupported", s.Unsupported), slog.Uint64("attached", s.Attached), slog.Uint64("attach_errors", s.AttachErrors))
}

// Finder finds HotSpot among a process's mappings. Only files named libjvm.so are opened,
// each once per identity whatever process maps it: a process that is not a JVM costs a
// look at its mappings' names.
type Finder struct {
	max   int
	mu    sync.Mutex
	files map[objfile.ID]*inspected
	stats FinderStats
}

type inspected struct {
	lib *LibJVM
	err error
}

// DefaultMaxFiles is how many files' verdicts a Finder keeps.
const DefaultMaxFiles = 1024

// NewFinder returns a Finder remembering at most maxFiles verdicts (0: DefaultMaxFiles).
func NewFinder(maxFiles int) *Finder {
	if maxFiles <= 0 {
		maxFiles = DefaultMaxFiles
	}
	return &Finder{max: maxFiles, files: map[objfile.ID]*inspected{}}
}

// Stats returns the counts so far.
func (f *Finder) Stats() FinderStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// Find reads the HotSpot a process maps: nil and no error for a process that maps no
// libjvm.so, an error for one whose HotSpot sonde cannot read (the error says why).
func (f *Finder) Find(pid uint32, mappings []*trace.Mapping) (*Process, error) {
	for _, m := range mappings {
		if m.File == nil || !IsLibJVM(m.Path) {
			continue
		}
		if p, err := f.findIn(pid, m); p != nil || err != nil {
			return p, err
		}
	}
	return nil, nil
}

// fileError is why HotSpot cannot be read in a file, whichever process maps it.
type fileError struct {
	path string
	err  error
}

func (e *fileError) Error() string { return e.path + ": " + e.err.Error() }
func (e *fileError) Unwrap() error { return e.err }

// findIn reads the HotSpot of libjvm.so mapping m in process pid: nil and no error when
// the mapping lies at no segment of the file. An error of the file itself is a
// *fileError.
func (f *Finder) findIn(pid uint32, m *trace.Mapping) (*Process, error) {
	lib, err := f.inspect(m.File)
	if err != nil {
		return nil, &fileError{path: m.Path, err: err}
	}
	bias, ok := lib.Bias(m.Start, m.Offset)
	if !ok {
		return nil, nil
	}
	p, err := NewProcess(ProcessMemory(pid), lib, bias)
	f.mu.Lock()
	if err != nil {
		f.stats.AttachErrors++
	} else {
		f.stats.Attached++
	}
	f.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("read HotSpot of %s in process %d: %w", m.Path, pid, err)
	}
	return p, nil
}

func (f *Finder) inspect(file *objfile.File) (*LibJVM, error) {
	id := file.ID()
	f.mu.Lock()
	v, seen := f.files[id]
	f.mu.Unlock()
	if seen {
		return v.lib, v.err
	}
	lib, err := InspectFile(file)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.files) >= f.max {
		clear(f.files)
	}
	f.files[id] = &inspected{lib, err}
	f.stats.FilesInspected++
	switch {
	case err == nil:
		f.stats.HotSpots++
	case err != ErrNotHotSpot: // a libjvm.so without all of the tables' symbols, or unreadable
		f.stats.Unsupported++
	}
	return lib, err
}
