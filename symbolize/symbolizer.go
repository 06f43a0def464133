package symbolize

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/elastic/go-freelru"
	"github.com/ianlancetaylor/demangle"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

// DefaultKallsymsPath is where the kernel lists its symbols.
const DefaultKallsymsPath = "/proc/kallsyms"

// kallsymsReloadInterval bounds how often a kernel address that misses rereads kallsyms:
// often enough to learn of modules and BPF programs loaded since, rarely enough that
// addresses no reload will ever name (JIT trampolines, hidden addresses) cost little.
const kallsymsReloadInterval = 30 * time.Second

// Cache and input bounds used when Options leave them zero.
const (
	// DefaultFileCacheSize is how many object files stay parsed. A host's profile
	// touches some dozens of distinct binaries and libraries per interval.
	DefaultFileCacheSize = 128
	// DefaultAddressCacheSize is how many named addresses are kept, each about 100
	// bytes plus its lines; it covers the distinct frames of a busy host's interval.
	DefaultAddressCacheSize = 65536
	// DefaultMaxDebugInfoSize bounds the uncompressed DWARF sections read for one
	// file: past it the file is named from its symbol table, so that one huge C++
	// binary cannot take the agent's memory or stall an interval for long.
	DefaultMaxDebugInfoSize = 512 << 20
)

// failureRetryInterval is how long a file that could not be read stays failed: long
// enough that a broken file costs little, short enough that a file whose process
// exited before it was read is read through the next process that maps it.
const failureRetryInterval = time.Minute

// maxReportedFailures bounds the files whose failure is remembered so that it is
// returned once; past it the memory is cleared and a failure may be returned again.
const maxReportedFailures = 4096

// Mode says how much a Symbolizer reads.
type Mode string

const (
	// ModeFull reads symbol tables, DWARF (in the file or a separate debug file) and
	// Go's pclntab: functions, files, lines and inlined frames.
	ModeFull Mode = "full"
	// ModeSymtab reads no DWARF: ELF symbol tables (also those of separate debug
	// files) name native functions; Go binaries still get files, lines and inlined
	// frames, which their pclntab holds at little cost.
	ModeSymtab Mode = "symtab"
	// ModeNone names nothing: locations keep their addresses and build IDs for a
	// backend to symbolize.
	ModeNone Mode = "none"
)

// ParseMode parses the name of a Mode, as a flag takes it.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeFull, ModeSymtab, ModeNone:
		return m, nil
	default:
		return "", fmt.Errorf("symbolization mode %q: want full, symtab or none", s)
	}
}

// Options configure a Symbolizer. The zero value reads everything with default bounds.
type Options struct {
	// KallsymsPath is the kernel symbol list; empty means DefaultKallsymsPath.
	KallsymsPath string
	// Mode is ModeFull when empty. An unknown mode is taken as ModeFull; validate
	// user input with ParseMode.
	Mode Mode
	// FileCacheSize is how many parsed object files are kept, least recently used
	// evicted first; 0 or less means DefaultFileCacheSize.
	FileCacheSize int
	// AddressCacheSize is how many (file, offset) results are kept across all files;
	// 0 means DefaultAddressCacheSize, less than 0 keeps none.
	AddressCacheSize int
	// DebugDirs are searched for separate debug files, by build ID and by
	// .gnu_debuglink; nil means DefaultDebugDirs, an empty slice none.
	DebugDirs []string
	// Interp names interpreted frames (trace.FramePython); without it they stay unnamed.
	Interp InterpNamer
	// MaxDebugInfoSize bounds the DWARF read for one file, in uncompressed bytes;
	// 0 means DefaultMaxDebugInfoSize, less than 0 no bound.
	MaxDebugInfoSize int64
}

// InterpNamer names the frames of an interpreter, whose code lives in the process's
// memory rather than in a file (package interp/python for CPython).
type InterpNamer interface {
	Name(loc *trace.Location) ([]trace.Line, bool)
}

// Stats count a Symbolizer's work over its lifetime.
type Stats struct {
	FilesLoaded int // object files read; a file evicted and needed again counts again
	FilesFailed int // files that could not be opened or parsed
	// DebugInfoFailed counts files whose DWARF, Go tables or separate debug file
	// could not be used; their symbol tables named their frames.
	DebugInfoFailed int
	DebugFilesUsed  int   // separate debug files found by build ID or .gnu_debuglink
	FilesEvicted    int   // parsed files dropped from the cache to make room
	CachedFiles     int   // files held now, failures included
	CachedFileBytes int64 // estimated memory the held files take
	AddressHits     int   // locations answered from the address cache
	AddressMisses   int   // locations looked up in a file's tables
	// LocationsNamed and LocationsUnnamed count the locations Symbolize was given
	// without lines, by outcome.
	LocationsNamed   int
	LocationsUnnamed int
	// Sheds counts the times the caches were emptied to give memory back.
	Sheds int
}

// Symbolizer names profile locations. A file is opened and parsed once, whichever
// processes map it, and kept in a bounded LRU cache keyed by build ID; the names of
// addresses are kept in a second bounded cache. Failures are cached too, so that a
// file is not retried while the cache holds it, and each is returned once.
type Symbolizer struct {
	mu           sync.Mutex
	kallsymsPath string
	mode         Mode
	load         loadOptions
	now          func() time.Time // replaced by tests
	seed         maphash.Seed
	files        *freelru.LRU[fileID, *objFile] // a nil *objFile is a file that failed
	addrs        *freelru.LRU[addrKey, named]   // nil when disabled
	reported     map[fileID]struct{}
	cachedBytes  int64
	kernel       kernelState
	interp       InterpNamer
	stats        Stats
}

// fileID identifies an object file's contents: by build ID where it has one, so that
// copies in different containers are read once, else by its hash or inode.
type fileID = objfile.ID

// addrKey is an offset in a file, the file given by the 64-bit hash of its fileID:
// two uint64 hash and compare faster than a key holding a string, and two files
// colliding in 64 bits is not a risk worth a wider key.
type addrKey struct {
	file, off uint64
}

// named is a cached result: nil lines with SourceNone for an address nothing names.
type named struct {
	lines  []trace.Line
	source string
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
	s := &Symbolizer{
		kallsymsPath: cmp.Or(opts.KallsymsPath, DefaultKallsymsPath),
		mode:         opts.Mode,
		now:          time.Now,
		seed:         maphash.MakeSeed(),
		reported:     map[fileID]struct{}{},
		interp:       opts.Interp,
	}
	switch s.mode {
	case ModeFull, ModeSymtab, ModeNone:
	default:
		s.mode = ModeFull
	}
	s.load = loadOptions{mode: s.mode, debugDirs: opts.DebugDirs, maxDebugInfo: opts.MaxDebugInfoSize}
	if s.load.debugDirs == nil {
		s.load.debugDirs = DefaultDebugDirs
	}
	switch {
	case s.load.maxDebugInfo == 0:
		s.load.maxDebugInfo = DefaultMaxDebugInfoSize
	case s.load.maxDebugInfo < 0:
		s.load.maxDebugInfo = 0 // dwarf.Load's "no bound"
	}
	if s.mode == ModeNone {
		return s
	}
	fileCap := opts.FileCacheSize
	if fileCap <= 0 {
		fileCap = DefaultFileCacheSize
	}
	// The capacities are positive and the hash functions set, the only ways New fails.
	s.files, _ = freelru.New[fileID, *objFile](uint32(min(fileCap, math.MaxUint32)), s.hashFile)
	s.files.SetOnEvict(func(_ fileID, obj *objFile) {
		s.stats.FilesEvicted++
		if obj != nil {
			s.cachedBytes -= obj.size
		}
	})
	addrCap := opts.AddressCacheSize
	if addrCap == 0 {
		addrCap = DefaultAddressCacheSize
	}
	if addrCap > 0 {
		s.addrs, _ = freelru.New[addrKey, named](uint32(min(addrCap, math.MaxUint32)), hashAddr)
	}
	return s
}

func (s *Symbolizer) hashFile(id fileID) uint32 { return uint32(s.fileHash(id)) }

func (s *Symbolizer) fileHash(id fileID) uint64 {
	h := maphash.String(s.seed, id.Value)
	return h ^ (uint64(id.Kind)<<56 | id.Key.Dev*0x9e3779b97f4a7c15 ^ id.Key.Inode*0xc2b2ae3d27d4eb4f)
}

func hashAddr(k addrKey) uint32 {
	h := k.file ^ k.off*0x9e3779b97f4a7c15
	h ^= h >> 29
	return uint32(h) ^ uint32(h>>32)
}

// fileRef is what one Symbolize call learned of a mapped file.
type fileRef struct {
	id     fileID
	hash   uint64
	obj    *objFile
	looked bool // obj was fetched or loaded
}

// Symbolize fills the Lines of every location of p not symbolized before (NameSource
// empty) that can be named, and records in NameSource where each name came from; the
// others keep empty Lines and get NameSource "none", and reporters show them as
// addresses with build IDs. The collector hands a location to every profile that reports
// it while it lives: it is named once, and never written again, so that profiles already
// handed on can be read while the next one is symbolized.
//
// Return addresses, the frames below the innermost of each stack, are looked up one
// byte earlier, inside the call instruction: the address after a call may start
// another line, inlined call or even function, and it is the call that the frame
// stands for. A location that is the innermost frame of one sample and a caller in
// another is named as a caller.
//
// The errors say which files, debug information or kernel symbols could not be read.
// Each file's error is returned once, and a kallsyms error once until a read succeeds
// again, so that a caller can log every error it gets without repeating itself.
// Lines may be shared between locations and must be treated as read-only.
func (s *Symbolizer) Symbolize(p *trace.Profile) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode == ModeNone {
		for _, loc := range p.Locations {
			if loc != nil && loc.NameSource == "" && len(loc.Lines) == 0 {
				// A code object's address means nothing once its process is gone: no
				// backend could name it later, so interpreted frames are named anyway.
				if loc.Kind == trace.FramePython && s.interp != nil {
					if lines, ok := s.interp.Name(loc); ok {
						loc.Lines, loc.NameSource = lines, SourceCPython
						s.stats.LocationsNamed++
						continue
					}
				}
				loc.NameSource = SourceNone
				s.stats.LocationsUnnamed++
			}
		}
		return nil
	}
	callers := returnAddresses(p)
	refs := map[*objfile.File]*fileRef{}
	var errs []error
	for _, loc := range p.Locations {
		if loc == nil || loc.NameSource != "" || len(loc.Lines) > 0 {
			continue
		}
		back := uint64(0)
		if callers[loc] {
			back = 1
		}
		var (
			lines  []trace.Line
			source = SourceNone
			err    error
		)
		if loc.Kind == trace.FramePython {
			// Interpreted code has no address to look a byte back from: the frame names
			// its instruction.
			if s.interp != nil {
				lines, _ = s.interp.Name(loc)
				source = SourceCPython
			}
		} else if loc.Kind == trace.FrameKernel {
			if loc.Address >= back {
				lines, err = s.kernelLines(loc.Address - back)
				source = SourceKallsyms
			}
		} else if off, ok := loc.FileOffset(); ok && off >= back {
			ref := refs[loc.Mapping.File]
			if ref == nil {
				id := loc.Mapping.File.ID()
				ref = &fileRef{id: id, hash: s.fileHash(id)}
				refs[loc.Mapping.File] = ref
			}
			lines, source, err = s.fileLines(ref, loc.Mapping.File, off-back)
		}
		if err != nil {
			errs = append(errs, err)
		}
		if len(lines) == 0 {
			loc.NameSource = SourceNone
			s.stats.LocationsUnnamed++
			continue
		}
		loc.Lines, loc.NameSource = lines, source
		s.stats.LocationsNamed++
	}
	return errs
}

// returnAddresses returns the locations p's samples pass as callers: every kernel
// frame but the first of a stack, and every user frame but the first. Only locations
// still to be named are of interest.
func returnAddresses(p *trace.Profile) map[*trace.Location]bool {
	callers := make(map[*trace.Location]bool, len(p.Locations))
	for _, smp := range p.Samples {
		if smp == nil {
			continue
		}
		kernelLeaf, userLeaf := true, true
		for _, l := range smp.Locations {
			switch {
			case l == nil:
			case l.Kind == trace.FrameKernel:
				if !kernelLeaf && l.NameSource == "" {
					callers[l] = true
				}
				kernelLeaf = false
			default:
				if !userLeaf && l.NameSource == "" {
					callers[l] = true
				}
				userLeaf = false
			}
		}
	}
	return callers
}

// fileLines names an offset in a file, from the address cache or the file's tables.
func (s *Symbolizer) fileLines(ref *fileRef, f *objfile.File, off uint64) ([]trace.Line, string, error) {
	key := addrKey{file: ref.hash, off: off}
	if s.addrs != nil {
		if n, ok := s.addrs.Get(key); ok {
			s.stats.AddressHits++
			return n.lines, n.source, nil
		}
	}
	s.stats.AddressMisses++
	obj, err := s.object(ref, f)
	if obj == nil {
		// Not cached: the file may be readable once the cache lets it go.
		return nil, SourceNone, err
	}
	lines, source := obj.lookup(off)
	if s.addrs != nil {
		s.addrs.Add(key, named{lines: slices.Clip(lines), source: source})
	}
	return lines, source, err
}

// object returns the parsed file, reading it if the cache does not hold it. The
// error is non-nil only the first time a file fails.
func (s *Symbolizer) object(ref *fileRef, f *objfile.File) (*objFile, error) {
	if ref.looked {
		return ref.obj, nil
	}
	ref.looked = true
	if obj, ok := s.files.Get(ref.id); ok {
		ref.obj = obj
		return obj, nil
	}
	obj, err := loadObjFile(f, s.load)
	switch {
	case obj == nil:
		s.stats.FilesFailed++
	default:
		s.stats.FilesLoaded++
		s.cachedBytes += obj.size
		if err != nil {
			s.stats.DebugInfoFailed++
		}
		if obj.debugPath != "" {
			s.stats.DebugFilesUsed++
		}
	}
	if obj == nil {
		s.files.AddWithLifetime(ref.id, nil, failureRetryInterval)
	} else {
		s.files.Add(ref.id, obj)
	}
	ref.obj = obj
	if err == nil {
		return obj, nil
	}
	if _, seen := s.reported[ref.id]; seen {
		return obj, nil
	}
	if len(s.reported) >= maxReportedFailures {
		clear(s.reported)
	}
	s.reported[ref.id] = struct{}{}
	return obj, err
}

// Stats returns the counts so far.
func (s *Symbolizer) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	if s.files != nil {
		st.CachedFiles = s.files.Len()
	}
	st.CachedFileBytes = s.cachedBytes
	return st
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
