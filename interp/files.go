package interp

import (
	"debug/elf"
	"errors"
	"sync"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// DefaultMaxFiles is how many files' verdicts a Files keeps unless told otherwise: a host
// maps a few hundred distinct executable files.
const DefaultMaxFiles = 4096

// FileStats counts what a Files did.
type FileStats struct {
	Inspected   int // files looked at, of the runtime or not
	Found       int // of which hold the runtime, as sonde walks it
	Unsupported int // of which hold it in a version or build sonde cannot walk
}

// Files inspects each mapped file once, by identity, whatever processes map it, and keeps
// the verdict: the runtime T it holds, or nil. It is bounded: past max verdicts it forgets
// them all, cheap to find again. It is safe for concurrent use.
type Files[T any] struct {
	max int
	// inspect reads the runtime in an ELF file; notIt is its error for a file without one.
	inspect func(*elf.File) (*T, error)
	notIt   error
	// onError hears once per file why the runtime in it cannot be walked.
	onError func(path string, err error)
	// Found, when set before the first Get, hears once per file of each runtime found.
	Found func(path string, v *T)

	mu    sync.Mutex
	files map[objfile.ID]*T
	stats FileStats
}

// NewFiles returns a Files that inspects with inspect, which returns notIt for a file that
// does not hold the runtime, and tells onError (may be nil) of the files that hold one it
// cannot walk. max 0 means DefaultMaxFiles.
func NewFiles[T any](max int, inspect func(*elf.File) (*T, error), notIt error, onError func(path string, err error)) *Files[T] {
	if max <= 0 {
		max = DefaultMaxFiles
	}
	return &Files[T]{max: max, inspect: inspect, notIt: notIt, onError: onError, files: map[objfile.ID]*T{}}
}

// Get returns the runtime f holds, inspecting f the first time; nil for a file without one,
// or with one sonde cannot walk.
func (fs *Files[T]) Get(f *objfile.File) *T {
	id := f.ID()
	fs.mu.Lock()
	v, seen := fs.files[id]
	fs.mu.Unlock()
	if seen {
		return v
	}
	v, err := fs.inspectFile(f)
	fs.mu.Lock()
	if len(fs.files) >= fs.max {
		clear(fs.files)
	}
	fs.files[id] = v
	fs.stats.Inspected++
	unsupported := v == nil && err != nil && !errors.Is(err, fs.notIt)
	switch {
	case v != nil:
		fs.stats.Found++
	case unsupported:
		fs.stats.Unsupported++
	}
	fs.mu.Unlock()
	if unsupported && fs.onError != nil {
		fs.onError(f.Path, err)
	}
	if v != nil && fs.Found != nil {
		fs.Found(f.Path, v)
	}
	return v
}

func (fs *Files[T]) inspectFile(f *objfile.File) (*T, error) {
	h, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	var v *T
	err = h.InspectELF(fs.notIt, func(e *elf.File) (err error) {
		v, err = fs.inspect(e)
		return err
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

// Stats returns the counts so far.
func (fs *Files[T]) Stats() FileStats {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.stats
}
