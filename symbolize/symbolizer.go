package symbolize

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/ianlancetaylor/demangle"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/symbolize/dwarf"
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
	// DefaultFileCacheBytes bounds the memory parsed files hold, as estimated. Files
	// are mapped, and a file's tables on the heap are its symbols and the indexes of
	// its Go tables and DWARF: tens to hundreds of KiB for most, a few MiB for large
	// C++ programs without separate debug information.
	DefaultFileCacheBytes = 8 << 20
	// DefaultDWARFCacheBytes bounds the DWARF units decoded for lookups, across files.
	// A unit is decoded when a lookup first needs it and its lines and inline tree
	// take some KiB to a few hundred (the C library's 2000 units average 2 KiB).
	DefaultDWARFCacheBytes = 4 << 20
	// DefaultAddressCacheSize is how many named addresses are kept; it covers the
	// distinct frames of a busy host's interval.
	DefaultAddressCacheSize = 65536
	// DefaultAddressCacheBytes bounds the named addresses' memory: an entry and its
	// lines take about 250 bytes, more with inlined frames, so that this holds the
	// 15 000 or so distinct frames of a busy host's interval.
	DefaultAddressCacheBytes = 4 << 20
	// DefaultMaxDebugInfoSize bounds the uncompressed DWARF sections read for one
	// file: past it the file is named from its symbol table, so that one huge C++
	// binary cannot take the agent's memory or stall an interval for long.
	DefaultMaxDebugInfoSize = 512 << 20
	// DefaultMaxDecompressedBytes bounds the decompressed copies of compressed DWARF
	// sections held at once, all files together: a Go binary's take a few MiB to a few
	// tens, all of a file's at once, outside the Go heap. Past it, the copies used
	// longest ago go first; a file whose copies alone exceed it is named from its
	// symbol table (and a Go binary from its pclntab, as always).
	DefaultMaxDecompressedBytes = 32 << 20
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
	// FileCacheBytes bounds the estimated memory of the parsed files kept, which
	// ever of it and FileCacheSize is reached first evicting; 0 means
	// DefaultFileCacheBytes, less than 0 no bound in bytes. The file used last stays
	// however large it is.
	FileCacheBytes int64
	// DWARFCacheBytes bounds the memory of the DWARF units decoded for lookups, across
	// files; 0 means DefaultDWARFCacheBytes, less than 0 keeps none past the lookup
	// that decoded it.
	DWARFCacheBytes int64
	// AddressCacheSize is how many (file, offset) results are kept across all files;
	// 0 means DefaultAddressCacheSize, less than 0 keeps none.
	AddressCacheSize int
	// AddressCacheBytes bounds the estimated memory of the results kept, whichever of
	// it and AddressCacheSize is reached first evicting; 0 means
	// DefaultAddressCacheBytes, less than 0 no bound in bytes.
	AddressCacheBytes int64
	// DebugDirs are searched for separate debug files, by build ID and by
	// .gnu_debuglink; nil means DefaultDebugDirs, an empty slice none.
	DebugDirs []string
	// Runtimes name the frames of language runtimes (trace.FrameInterp), by the runtime's
	// number in the frame; a runtime's frames without a namer stay unnamed.
	Runtimes map[uint8]InterpNamer
	// MaxDebugInfoSize bounds the DWARF read for one file, in uncompressed bytes;
	// 0 means DefaultMaxDebugInfoSize, less than 0 no bound.
	MaxDebugInfoSize int64
	// MaxDecompressedBytes bounds the decompressed DWARF sections of all files held
	// at once; 0 means DefaultMaxDecompressedBytes, less than 0 no bound.
	MaxDecompressedBytes int64
	// DebugFetcher is asked for the debug files of objects that have none on this
	// host; nil means none is asked. See renameFetched for when names change.
	DebugFetcher DebugFetcher
}

// InterpNamer names the frames of an interpreter, whose code lives in the process's
// memory rather than in a file (a package under interp/ for each runtime).
type InterpNamer interface {
	Name(loc *trace.Location) ([]trace.Line, bool)
}

// interpNamer returns the namer of a runtime's frame, or nil.
func (s *Symbolizer) interpNamer(loc *trace.Location) InterpNamer {
	if loc.Kind != trace.FrameInterp || loc.Interp == nil {
		return nil
	}
	return s.runtimes[loc.Interp.Runtime]
}

// interpLines names a runtime's frame by its runtime's namer.
func (s *Symbolizer) interpLines(loc *trace.Location) ([]trace.Line, bool) {
	if n := s.interpNamer(loc); n != nil {
		return n.Name(loc)
	}
	return nil, false
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
	// CachedDWARFBytes is the estimated memory of the DWARF units decoded and held.
	CachedDWARFBytes int64
	// DecompressedBytes is the memory the decompressed copies of compressed DWARF
	// sections hold now, DecompressedPeakBytes the most they held at once, and
	// DecompressRefused counts files whose copies alone would exceed the bound.
	// DecompressedTotalBytes adds up every decompression: what naming spent
	// inflating sections, again each time their copies had gone.
	DecompressedBytes, DecompressedPeakBytes, DecompressedTotalBytes int64
	DecompressRefused                                                int
	// FilesFaulted counts files dropped because reading their mapping faulted: they
	// shrank or changed on disk while mapped. They are read afresh when met again.
	FilesFaulted       int
	AddressHits        int   // locations answered from the address cache
	AddressMisses      int   // locations looked up in a file's tables
	CachedAddresses    int   // named addresses held now
	CachedAddressBytes int64 // estimated memory they take
	// Sheds counts calls of Shed, and ShedBytes what they dropped, as estimated.
	Sheds     int
	ShedBytes int64
	// KernelSymbolBytes is the memory the kernel's symbols take.
	KernelSymbolBytes int64
	// LocationsNamed and LocationsUnnamed count the locations Symbolize was given
	// without lines, by outcome.
	LocationsNamed   int
	LocationsUnnamed int
	// DebugFilesFetched counts files read again because the DebugFetcher came to
	// have their debug files, and LocationsRenamed the locations named before that
	// and named again.
	DebugFilesFetched int
	LocationsRenamed  int
	// TailCallsRecovered counts the samples whose stacks got back frames that tail
	// calls had left out (see recoverTailCalls).
	TailCallsRecovered int
}

// Symbolizer names profile locations. A file is opened, mapped and parsed once,
// whichever processes map it, and kept in an LRU cache keyed by build ID; the names
// of addresses are kept in a second LRU cache. Both are bounded in entries and in
// bytes, and grow with use. Failures are cached too, so that a file is not retried
// while the cache holds it, and each is returned once.
type Symbolizer struct {
	mu           sync.Mutex
	kallsymsPath string
	mode         Mode
	load         loadOptions
	now          func() time.Time // replaced by tests
	afterLookup  func()           // nil but in tests: called after each file lookup
	seed         maphash.Seed
	files        *lru[fileID, fileEntry]
	addrs        *lru[addrKey, named] // nil when disabled
	units        *dwarf.Cache
	// closing holds the files evicted during a Symbolize call: a location may still
	// be looked up in one until the call ends, and its mappings must stay till then.
	closing  []*objFile
	shedding bool // evictions are Shed's, not the bounds'
	reported map[fileID]struct{}
	kernel   kernelState
	runtimes map[uint8]InterpNamer // name runtimes' frames, by the runtime's number
	tails    tailCache
	stats    Stats
	// awaiting are the files read before the DebugFetcher had their debug files, and
	// arrived those that have them since; fetched holds the copies of their locations
	// named again (see renameFetched).
	awaiting map[fileID]string
	arrived  map[fileID]struct{}
	fetched  *lru[*trace.Location, *trace.Location]
}

// fileEntry is a cached file, or a failure to read one that is retried after until.
type fileEntry struct {
	obj   *objFile
	until time.Time
}

// fileEntryBytes is what a file's entry costs the cache beside the file itself: its
// slot, its key (and the key's string) and its share of the index map.
const fileEntryBytes = int64(unsafe.Sizeof(slot[fileID, fileEntry]{})) + 64

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
	reads    int  // attempts
	// missed holds when addresses no symbol named were first looked up. A reread is
	// for an address no read since then has failed to name, or one would be made
	// every 30 s for an address no reread names (a trampoline), parsing the whole of
	// kallsyms each time.
	missed map[uint64]time.Time
}

// maxKernelMissed bounds kernelState.missed; past it, the set starts over.
const maxKernelMissed = 4096

// New returns a Symbolizer; it reads nothing until asked to name locations.
func New(opts Options) *Symbolizer {
	s := &Symbolizer{
		kallsymsPath: cmp.Or(opts.KallsymsPath, DefaultKallsymsPath),
		mode:         opts.Mode,
		now:          time.Now,
		seed:         maphash.MakeSeed(),
		reported:     map[fileID]struct{}{},
		runtimes:     opts.Runtimes,
	}
	switch s.mode {
	case ModeFull, ModeSymtab, ModeNone:
	default:
		s.mode = ModeFull
	}
	s.load = loadOptions{mode: s.mode, debugDirs: opts.DebugDirs, maxDebugInfo: opts.MaxDebugInfoSize, fetcher: opts.DebugFetcher}
	s.awaiting, s.arrived = map[fileID]string{}, map[fileID]struct{}{}
	s.fetched = newLRU[*trace.Location, *trace.Location](maxRenamed, 0, nil)
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
	s.files = newLRU(fileCap, byteBound(opts.FileCacheBytes, DefaultFileCacheBytes), func(_ fileID, e fileEntry) {
		if !s.shedding {
			s.stats.FilesEvicted++
		}
		if e.obj != nil {
			s.closing = append(s.closing, e.obj)
		}
	})
	unitBytes := opts.DWARFCacheBytes
	switch {
	case unitBytes == 0:
		unitBytes = DefaultDWARFCacheBytes
	case unitBytes < 0:
		unitBytes = 0
	}
	s.units = dwarf.NewCache(unitBytes)
	s.units.LimitDecompressed(byteBound(opts.MaxDecompressedBytes, DefaultMaxDecompressedBytes))
	s.load.units = s.units
	addrCap := opts.AddressCacheSize
	if addrCap == 0 {
		addrCap = DefaultAddressCacheSize
	}
	if addrCap > 0 {
		s.addrs = newLRU[addrKey, named](addrCap, byteBound(opts.AddressCacheBytes, DefaultAddressCacheBytes), nil)
	}
	return s
}

// byteBound is the bound in bytes an option asks for: 0 the default, less than 0
// none (0 to the cache).
func byteBound(opt, def int64) int64 {
	switch {
	case opt == 0:
		return def
	case opt < 0:
		return 0
	default:
		return opt
	}
}

func (s *Symbolizer) fileHash(id fileID) uint64 {
	h := maphash.String(s.seed, id.Value)
	return h ^ (uint64(id.Kind)<<56 | id.Key.Dev*0x9e3779b97f4a7c15 ^ id.Key.Inode*0xc2b2ae3d27d4eb4f)
}

// Sizes the address cache's estimates are made of: an entry's slot (key, value,
// size and links) and its share of the index map, and one trace.Line.
const (
	addrEntryBytes = 72 + 40
	lineBytes      = int64(unsafe.Sizeof(trace.Line{}))
)

// size estimates the memory a cached result holds: its entry, its lines and their
// strings, each string rounded up to the allocator's granule. Strings that lines of
// other results share (a file, a function several addresses are in) count for each.
func (n named) size() int64 {
	size := int64(addrEntryBytes) + int64(cap(n.lines))*lineBytes
	for _, l := range n.lines {
		size += allocBytes(l.Function) + allocBytes(l.File)
		if unsafe.StringData(l.SystemName) != unsafe.StringData(l.Function) {
			size += allocBytes(l.SystemName)
		}
	}
	return size
}

func allocBytes(s string) int64 {
	if len(s) == 0 {
		return 0
	}
	return int64(len(s)+7) &^ 7
}

// fileRef is what one Symbolize call learned of a mapped file.
type fileRef struct {
	id     fileID
	hash   uint64
	obj    *objFile
	looked bool // obj was fetched or loaded
	// want are the file offsets this call looks up (a byte back for callers), for
	// DWARF to fetch what their units need in one pass; prepared says it has.
	want     []uint64
	prepared bool
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
				// A runtime's code means nothing once its process is gone: no backend
				// could name it later, so runtimes' frames are named anyway.
				if lines, ok := s.interpLines(loc); ok {
					loc.Lines, loc.NameSource = lines, loc.KindName()
					s.stats.LocationsNamed++
					continue
				}
				loc.NameSource = SourceNone
				s.stats.LocationsUnnamed++
			}
		}
		return nil
	}
	s.renameFetched(p)
	callers := returnAddresses(p)
	todo := byFile(p.Locations)
	wants := wantedOffsets(todo, callers)
	refs := map[*objfile.File]*fileRef{}
	defer s.finish(refs)
	var (
		errs []error
		prev *fileRef
	)
	for _, loc := range todo {
		// A file's locations come together: once past them, what their lookups made
		// resident goes, so that a call's peak is its largest file's, not their sum.
		if prev != nil && (loc.Mapping == nil || refs[loc.Mapping.File] != prev) {
			if prev.obj != nil {
				prev.obj.releasePages()
				prev.obj.trim(s.now())
			}
			prev = nil
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
		if loc.Kind == trace.FrameInterp {
			// A runtime's frame has no address to look a byte back from: it names its
			// instruction.
			if s.interpNamer(loc) != nil {
				lines, _ = s.interpLines(loc)
				source = loc.KindName()
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
				ref.want = s.notCached(ref.hash, wants[loc.Mapping.File])
				refs[loc.Mapping.File] = ref
			}
			prev = ref
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
	s.recoverTailCalls(p, refs)
	return errs
}

// notCached returns the offsets of offs the address cache does not name: the ones a pass
// will look up in the file.
func (s *Symbolizer) notCached(file uint64, offs []uint64) []uint64 {
	if s.addrs == nil {
		return offs
	}
	return slices.DeleteFunc(offs, func(off uint64) bool { return s.addrs.Has(addrKey{file: file, off: off}) })
}

// wantedOffsets returns the offsets each file's locations are looked up at.
func wantedOffsets(todo []*trace.Location, callers map[*trace.Location]bool) map[*objfile.File][]uint64 {
	wants := map[*objfile.File][]uint64{}
	for _, loc := range todo {
		if loc.Kind == trace.FrameKernel || loc.Kind == trace.FrameInterp || loc.Mapping == nil {
			continue
		}
		off, ok := loc.FileOffset()
		if callers[loc] {
			off--
		}
		if ok && off != math.MaxUint64 {
			wants[loc.Mapping.File] = append(wants[loc.Mapping.File], off)
		}
	}
	return wants
}

// byFile returns the locations still to be named, kernel ones first and then by
// mapped file, each file's in their order in the profile.
func byFile(locs []*trace.Location) []*trace.Location {
	group := map[*objfile.File]int{}
	var todo []*trace.Location
	for _, loc := range locs {
		if loc == nil || loc.NameSource != "" || len(loc.Lines) > 0 {
			continue
		}
		todo = append(todo, loc)
		if loc.Kind != trace.FrameKernel && loc.Mapping != nil {
			if _, ok := group[loc.Mapping.File]; !ok {
				group[loc.Mapping.File] = len(group) + 1
			}
		}
	}
	slices.SortStableFunc(todo, func(a, b *trace.Location) int {
		return cmp.Compare(locGroup(group, a), locGroup(group, b))
	})
	return todo
}

func locGroup(group map[*objfile.File]int, loc *trace.Location) int {
	if loc.Kind == trace.FrameKernel || loc.Mapping == nil {
		return 0
	}
	return group[loc.Mapping.File]
}

// finish ends a Symbolize call: the files it read let go of what only a run of
// lookups needs (decompressed DWARF sections, the pages of their mappings the
// lookups touched), and the files evicted meanwhile are unmapped.
func (s *Symbolizer) finish(refs map[*objfile.File]*fileRef) {
	now := s.now()
	for _, ref := range refs {
		if ref.obj != nil {
			ref.obj.trim(now)
		}
	}
	for _, obj := range s.closing {
		obj.close()
	}
	clear(s.closing)
	s.closing = s.closing[:0]
	// Files this call did not read may hold decompressed DWARF, and resident pages of
	// their mappings, from earlier ones.
	s.files.Each(func(_ fileID, e fileEntry) {
		if e.obj != nil {
			e.obj.trim(now)
		}
	})
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
	var (
		lines     []trace.Line
		source    string
		lookupErr error
	)
	if fault := mmapfile.Guard(func() {
		if !ref.prepared {
			ref.prepared = true
			obj.prepare(ref.want)
		}
		lines, source, lookupErr = obj.lookup(off)
	}); fault != nil {
		s.dropFaulted(ref, obj)
		return nil, SourceNone, errors.Join(err, fmt.Errorf("read %s: %w", f.Path, fault))
	}
	if errors.Is(lookupErr, mmapfile.ErrFault) {
		// A fault a parser recovered: the file is as broken as above.
		s.dropFaulted(ref, obj)
		return nil, SourceNone, errors.Join(err, fmt.Errorf("read %s: %w", f.Path, lookupErr))
	}
	if obj.lookupsHeld++; obj.lookupsHeld >= releaseLookups {
		obj.releasePages()
	}
	if s.afterLookup != nil {
		s.afterLookup()
	}
	if lookupErr != nil && !obj.lookupFailed {
		// One error per file: the next broken part of it fails as quietly.
		obj.lookupFailed = true
		err = errors.Join(err, fmt.Errorf("name %#x in %s: %w", off, f.Path, lookupErr))
	}
	if s.addrs != nil {
		n := named{lines: slices.Clip(lines), source: source}
		s.addrs.Add(key, n, n.size())
	}
	return lines, source, err
}

// dropFaulted evicts a file whose mapping faulted. It stays mapped until the
// Symbolize call ends: other locations of this call may hold it yet, and see it
// as faulted.
func (s *Symbolizer) dropFaulted(ref *fileRef, obj *objFile) {
	ref.obj = nil
	if obj.faulted {
		return
	}
	obj.faulted = true
	s.stats.FilesFaulted++
	if e, ok := s.files.Get(ref.id); ok && e.obj == obj {
		s.files.Remove(ref.id)
	}
	s.closing = append(s.closing, obj)
}

// object returns the parsed file, reading it if the cache does not hold it. The
// error is non-nil only the first time a file fails.
func (s *Symbolizer) object(ref *fileRef, f *objfile.File) (*objFile, error) {
	if ref.looked {
		return ref.obj, nil
	}
	ref.looked = true
	if e, ok := s.files.Get(ref.id); ok {
		if e.obj != nil || s.now().Before(e.until) {
			ref.obj = e.obj
			return e.obj, nil
		}
		s.files.Remove(ref.id) // a failure old enough to retry
	}
	var (
		obj *objFile
		err error
	)
	if fault := mmapfile.Guard(func() { obj, err = loadObjFile(f, s.load, ref.want) }); fault != nil {
		// loadObjFile unmapped what it had mapped on its way out.
		obj, err = nil, fmt.Errorf("read %s: %w", f.Path, fault)
	}
	if obj != nil && errors.Is(err, mmapfile.ErrFault) {
		obj.close()
		obj = nil
	}
	switch {
	case obj == nil:
		s.stats.FilesFailed++
	default:
		s.stats.FilesLoaded++
		obj.dwarfReadAt = s.now() // Load read the sections to index them
		obj.dwarfPasses, obj.dwarfLoaded = 1, true
		ref.prepared = true // Load kept what the offsets wanted need
		if err != nil {
			s.stats.DebugInfoFailed++
		}
		if obj.debugPath != "" {
			s.stats.DebugFilesUsed++
		}
		if obj.awaitID != "" {
			s.await(ref, obj.awaitID)
		}
	}
	entryBytes := fileEntryBytes + int64(len(ref.id.Value))
	if obj == nil {
		s.files.Add(ref.id, fileEntry{until: s.now().Add(failureRetryInterval)}, entryBytes)
	} else {
		s.files.Add(ref.id, fileEntry{obj: obj}, entryBytes+obj.size)
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
		st.CachedFileBytes = s.files.Bytes()
	}
	st.CachedDWARFBytes = s.units.Bytes()
	d := s.units.Decompressed()
	st.DecompressedBytes, st.DecompressedPeakBytes, st.DecompressedTotalBytes, st.DecompressRefused = d.Bytes, d.PeakBytes, d.TotalBytes, d.Refused
	if s.kernel.syms != nil {
		st.KernelSymbolBytes = s.kernel.syms.SizeBytes()
	}
	if s.addrs != nil {
		st.CachedAddresses = s.addrs.Len()
		st.CachedAddressBytes = s.addrs.Bytes()
	}
	return st
}

// Shed drops every parsed file (unmapping it), every decoded DWARF unit and every
// named address, and returns the memory they held as estimated: for a watchdog to
// call when the process nears its memory limit. Naming goes on afterwards, reading
// files again as locations need them. The kernel's symbols stay.
func (s *Symbolizer) Shed() (freed int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.files == nil {
		return 0
	}
	freed = s.files.Bytes() + s.units.Bytes()
	s.shedding = true
	s.files.Clear()
	s.shedding = false
	for _, obj := range s.closing {
		obj.close()
	}
	clear(s.closing)
	s.closing = s.closing[:0]
	s.units.Shed()
	s.fetched.Clear() // the copies are named again from the files when next met
	if s.addrs != nil {
		freed += s.addrs.Bytes()
		s.addrs.Clear()
	}
	s.stats.Sheds++
	s.stats.ShedBytes += freed
	return freed
}

// sizeBytes estimates the heap memory obj holds: its tables, and what holds them
// together. Mapped files are not counted: their pages are the page cache's, and
// the process's only while lookups touch them (see trim).
func (obj *objFile) sizeBytes() int64 {
	n := int64(unsafe.Sizeof(objFile{})+unsafe.Sizeof(ELFSymbols{})+unsafe.Sizeof(SymbolTable{})) +
		obj.syms.Funcs.sizeBytes() + int64(cap(obj.syms.loads))*int64(unsafe.Sizeof(loadSegment{})) +
		int64(len(obj.debugPath)) + int64(cap(obj.maps))*(8+int64(unsafe.Sizeof(mmapfile.Region{})))
	if obj.dwarf != nil {
		n += obj.dwarf.SizeBytes()
	}
	if obj.gopcln != nil {
		n += obj.gopcln.SizeBytes()
	}
	if obj.unnamed != nil {
		n += obj.unnamed.sizeBytes()
	}
	return n
}

// close unmaps the files obj reads from and drops its decoded DWARF units. obj
// must not be used afterwards.
func (obj *objFile) close() {
	if obj.dwarf != nil {
		obj.dwarf.Close()
	}
	for _, m := range obj.maps {
		m.Close()
	}
	obj.maps = nil
}

// releaseInterval is how often a file in use lets go of what only a run of lookups
// needs: once per interval of a busy agent, and not after every Symbolize call of a
// caller that names locations one by one, whom decompressing DWARF again, the
// system calls and the faults that bring the pages back would cost more than the
// lookups.
const releaseInterval = 5 * time.Second

// releaseLookups is how many lookups in a file make resident what they read before its
// pages are given back, also within a run of one file's locations. A lookup reads a few
// scattered places (a binary search's steps, a function's entry, its name, line and
// inline tables), and the kernel maps 16 pages around each page a read faults in where
// the file is cached: the first naming pass of a large Go program (the Collector's),
// hundreds of new addresses, made 8 MB of its pclntab resident at once. Faulting back
// the few pages every search starts from costs microseconds a batch.
const releaseLookups = 16

// releasePages lets go of the pages of the file's mappings that lookups made resident:
// they stay in the page cache, and a later lookup faults them back in for little, where
// keeping them would add every file a naming pass reads to sonde's resident memory.
func (obj *objFile) releasePages() {
	obj.lookupsHeld = 0
	for _, m := range obj.maps {
		m.Release(m.Bytes())
	}
}

// dwarfIdleMin and dwarfIdleMax bound how long a file's decompressed DWARF sections stay
// after a lookup last read them. A file's large compressed sections (.debug_info,
// .debug_abbrev, .debug_line) are decompressed only where a pass's new units lie, and
// what a pass decompressed goes when it ends, its units decoded; the small ones (strings,
// ranges) stay for the idle time. A file whose passes keep decoding new units, the fourth
// within the idle time of the one before (dwarfHoldPasses), keeps whatever its sections
// decompress for the idle time instead, so that its later new units cost no more
// decompression, if they come to dwarfHoldMaxBytes at most. A larger file's passes
// decompress from the mark before their new units each time: a distribution's debug file
// of libc decompresses to 8.6 MB, which held for minutes was a quarter of sonde's memory
// where processes come and go (their new libc units keep coming), and walking all of its
// .debug_info costs about 20 ms. Each time the sections are needed again after they
// went, the file keeps them twice as long, so that a file whose new units keep coming
// decompresses a few times in all, never once an interval, and each time from the mark
// before its new units (dwarf.Table.Trim keeps a few marks). The bound on them across
// files (Options.MaxDecompressedBytes) keeps what they hold in check meanwhile. Lookups in
// units decoded already read no section.
const (
	dwarfIdleMin      = 30 * time.Second
	dwarfIdleMax      = 8 * time.Minute
	dwarfHoldPasses   = 4
	dwarfHoldMaxBytes = 4 << 20
)

// trimDWARF ends a pass over the file: what its large sections decompressed for it goes
// unless the file holds them, and every decompressed section goes once no lookup has
// read them for the file's idle time, which lengthens when they were read again after
// they went.
func (obj *objFile) trimDWARF(now time.Time) {
	if obj.dwarf == nil {
		return
	}
	if obj.dwarfIdle == 0 {
		obj.dwarfIdle = dwarfIdleMin
	}
	if r := obj.dwarf.SectionReads(); r != obj.dwarfReads {
		switch {
		case obj.dwarfLoaded: // one pass with the load
		case now.Sub(obj.dwarfReadAt) < obj.dwarfIdle:
			if obj.dwarfPasses++; obj.dwarfPasses >= dwarfHoldPasses && obj.dwarf.LazyBytes() <= dwarfHoldMaxBytes {
				obj.dwarf.Hold()
			}
		default:
			obj.dwarfPasses = 1
		}
		obj.dwarfReads, obj.dwarfReadAt = r, now
		if obj.dwarfLetGo {
			obj.dwarfIdle = min(2*obj.dwarfIdle, dwarfIdleMax)
			obj.dwarfLetGo = false
		}
	}
	obj.dwarfLoaded = false
	obj.dwarf.Thin()
	if !obj.dwarfLetGo && now.Sub(obj.dwarfReadAt) >= obj.dwarfIdle {
		obj.dwarf.Trim()
		obj.dwarfLetGo = true
		obj.dwarfPasses = 0
	}
}

// trim lets go of what only a run of lookups needs: the pages of the mappings the
// lookups made resident (they stay in the page cache, and come back at a fault's cost)
// if it has not for a while, and decompressed DWARF sections no lookup used for the
// file's idle time (trimDWARF).
func (obj *objFile) trim(now time.Time) {
	obj.trimDWARF(now)
	if now.Sub(obj.releasedAt) < releaseInterval {
		return
	}
	obj.releasedAt = now
	obj.releasePages()
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
	if err != nil {
		return nil, err
	}
	first, seen := k.missed[addr]
	if !seen {
		if k.missed == nil || len(k.missed) >= maxKernelMissed {
			k.missed = make(map[uint64]time.Time)
		}
		first = s.now()
		k.missed[addr] = first
	}
	if k.loadedAt.After(first) || s.now().Sub(k.loadedAt) < kallsymsReloadInterval {
		return nil, nil
	}
	if err := s.loadKernel(); err != nil {
		return nil, err
	}
	if k.syms != nil {
		if sym, ok := k.syms.Lookup(addr); ok {
			delete(k.missed, addr)
			return namedLine(sym.Name), nil
		}
	}
	return nil, nil
}

// loadKernel (re)reads kallsyms. It returns an error only when the previous attempt
// did not fail, so that a persistent failure is reported once.
// PrepareKernel reads the kernel's symbols now, if kernel frames are to be named and
// they were not read yet. Reading kallsyms takes a few megabytes for a moment (120 000
// names, sorted); an agent that reads them before it samples does so while its memory
// is at its lowest, rather than on top of its first naming pass. The error is the one
// the first pass would have returned.
func (s *Symbolizer) PrepareKernel() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode == ModeNone || s.kernel.tried {
		return nil
	}
	return s.loadKernel()
}

func (s *Symbolizer) loadKernel() error {
	k := &s.kernel
	k.tried = true
	k.reads++
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
