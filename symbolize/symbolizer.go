package symbolize

import (
	"fmt"
	"sync"
	"time"

	"github.com/ianlancetaylor/demangle"
	"github.com/sonde-profiler/sonde/trace"
)

// DefaultKallsymsPath is where the kernel lists its symbols.
const DefaultKallsymsPath = "/proc/kallsyms"

// kallsymsReloadInterval bounds how often a kernel address that misses rereads kallsyms:
// often enough to learn of modules and BPF programs loaded since, rarely enough that
// addresses no reload will ever name (JIT trampolines, hidden addresses) cost little.
const kallsymsReloadInterval = 30 * time.Second

// Options configure a Symbolizer.
type Options struct {
	// KallsymsPath is the kernel symbol list; empty means DefaultKallsymsPath.
	KallsymsPath string
}

// Stats count a Symbolizer's work over its lifetime.
type Stats struct {
	FilesLoaded      int // files whose symbols were read
	FilesFailed      int // files that could not be opened or parsed
	LocationsNamed   int // locations given at least one line
	LocationsUnnamed int // locations left without lines
}

// Symbolizer names profile locations. It reads every file once in its lifetime and keeps
// what it read, failures included, so a long-lived Symbolizer serves many profiles.
type Symbolizer struct {
	mu           sync.Mutex
	kallsymsPath string
	now          func() time.Time // replaced by tests
	files        map[trace.FileKey]source
	kernel       kernelState
	stats        Stats
}

// source names addresses of one object file. The ELF symbol table is the only one so
// far; DWARF line tables and Go's pclntab will be others, possibly chained so that the
// richest source that knows an address answers.
type source interface {
	// lines returns the frames at an offset in the file, innermost first, or nil.
	lines(fileOffset uint64) []trace.Line
}

// failedFile stands in for a file that could not be read, so that it is not retried.
type failedFile struct{}

func (failedFile) lines(uint64) []trace.Line { return nil }

func (e *ELFSymbols) lines(fileOffset uint64) []trace.Line {
	s, ok := e.LookupFileOffset(fileOffset)
	if !ok {
		return nil
	}
	return namedLine(s.Name)
}

// namedLine is the frame for a function known only by its symbol. Kernel names are
// demangled too: Rust in the kernel keeps its mangled names in kallsyms.
func namedLine(systemName string) []trace.Line {
	return []trace.Line{{Function: demangle.Filter(systemName), SystemName: systemName}}
}

type kernelState struct {
	syms     *KernelSymbols // nil until a load succeeds; kept when a reload fails
	loadedAt time.Time      // of the last attempt, successful or not
	tried    bool
	failing  bool // the last attempt failed and its error was returned
}

// New returns a Symbolizer; it reads nothing until asked to name locations.
func New(opts Options) *Symbolizer {
	path := opts.KallsymsPath
	if path == "" {
		path = DefaultKallsymsPath
	}
	return &Symbolizer{
		kallsymsPath: path,
		now:          time.Now,
		files:        make(map[trace.FileKey]source),
	}
}

// Symbolize fills the Lines of every location of p that has none and can be named; the
// others keep empty Lines, which reporters show as addresses. The errors say which files
// or kernel symbols could not be read. Each file's error is returned once in the
// Symbolizer's lifetime, and a kallsyms error once until a read succeeds again, so
// that a caller can log every error it gets without repeating itself.
func (s *Symbolizer) Symbolize(p *trace.Profile) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, loc := range p.Locations {
		if loc == nil || len(loc.Lines) > 0 {
			continue
		}
		var lines []trace.Line
		if loc.Kind == trace.FrameKernel {
			var err error
			lines, err = s.kernelLines(loc.Address)
			if err != nil {
				errs = append(errs, err)
			}
		} else if off, ok := loc.FileOffset(); ok {
			src, err := s.file(loc.Mapping.File)
			if err != nil {
				errs = append(errs, err)
			}
			lines = src.lines(off)
		}
		if len(lines) == 0 {
			s.stats.LocationsUnnamed++
			continue
		}
		loc.Lines = lines
		s.stats.LocationsNamed++
	}
	return errs
}

// Stats returns the counts so far.
func (s *Symbolizer) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// file returns the cached source for f, reading it the first time. The error is
// non-nil only on that first, failed, read.
func (s *Symbolizer) file(f *trace.File) (source, error) {
	if src, ok := s.files[f.Key]; ok {
		return src, nil
	}
	src, err := readFile(f)
	if err != nil {
		s.files[f.Key] = failedFile{}
		s.stats.FilesFailed++
		return failedFile{}, err
	}
	s.files[f.Key] = src
	s.stats.FilesLoaded++
	return src, nil
}

func readFile(f *trace.File) (source, error) {
	r, err := f.Open()
	if err != nil {
		return nil, err // names the path already
	}
	defer r.Close()
	syms, err := ReadELF(r)
	if err != nil {
		return nil, fmt.Errorf("read symbols of %s: %w", f.Path, err)
	}
	return syms, nil
}

// kernelLines names a kernel address, reading kallsyms the first time and again when an
// address misses and the last read is old enough.
func (s *Symbolizer) kernelLines(addr uint64) ([]trace.Line, error) {
	k := &s.kernel
	var err error
	if !k.tried {
		err = s.loadKernel()
	}
	if k.syms != nil {
		if sym, ok := k.syms.Lookup(addr); ok {
			return namedLine(sym.Name), err
		}
	}
	if err != nil || s.now().Sub(k.loadedAt) < kallsymsReloadInterval {
		return nil, err
	}
	if err := s.loadKernel(); err != nil {
		return nil, err
	}
	if k.syms != nil {
		if sym, ok := k.syms.Lookup(addr); ok {
			return namedLine(sym.Name), nil
		}
	}
	return nil, nil
}

// loadKernel (re)reads kallsyms. It returns an error only when the previous attempt
// did not fail, so that a persistent failure is reported once.
func (s *Symbolizer) loadKernel() error {
	k := &s.kernel
	k.tried = true
	k.loadedAt = s.now()
	syms, err := LoadKallsyms(s.kallsymsPath)
	if err != nil {
		if k.failing {
			return nil
		}
		k.failing = true
		return fmt.Errorf("read kernel symbols: %w", err)
	}
	k.syms, k.failing = syms, false
	return nil
}
