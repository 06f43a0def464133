package trace

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"hash/maphash"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// RawSample is one sample as the kernel recorded it. The collector copies what it keeps,
// so the slices may alias a reused buffer.
type RawSample struct {
	PID, TID uint32
	Comm     string
	Time     time.Time
	User     []uint64 // leaf first
	Kernel   []uint64 // leaf first
}

// Config tunes a Collector.
type Config struct {
	// ProcFS is where proc is mounted; "/proc" when empty.
	ProcFS string
	// Period is the CPU time one sample stands for.
	Period time.Duration
	// Kernel is the mapping kernel frames belong to; nil leaves them unmapped.
	Kernel *Mapping
	// KeepTimestamps records each sample's time, not only counts.
	KeepTimestamps bool
	// OnFileError is told, once per file, why a mapped file could not be identified.
	OnFileError func(path string, err error)
	// ChunkSize and ChunkCapacity tune the interning of stack chunks: frames per chunk and
	// chunks kept in the hash-LRU; zero means DefaultChunkSize and DefaultChunkCapacity.
	ChunkSize, ChunkCapacity int
	// Observer, when set, hears of every new reading of a process's mappings and of
	// processes the collector forgets: the kernel unwinder's tables follow them.
	Observer MappingObserver
}

// MappingObserver follows the processes the collector tracks.
type MappingObserver interface {
	// ProcessMappings gives a process's executable mappings, sorted by address.
	ProcessMappings(pid uint32, mappings []*Mapping)
	// ProcessGone says the collector no longer tracks pid.
	ProcessGone(pid uint32)
}

// Stats counts what the collector saw since it started.
type Stats struct {
	Samples          uint64
	UnresolvedFrames uint64 // user addresses outside every known mapping
	MapsReads        uint64
	MapsErrors       uint64 // /proc reads that failed, mostly processes that already exited
	FileErrors       uint64
	Processes        int // processes currently tracked
	Files            int // files currently tracked
	Traces           int // distinct stacks aggregated in the current interval
	Chunks           int // chunks in the intern cache
	Locations        int // locations the cached chunks hold
	ChunkHits        uint64
	ChunkMisses      uint64
	ChunkEvictions   uint64
	ChunkCollisions  uint64
}

// mapsRereadInterval rate-limits re-reading a process's maps when addresses miss every
// mapping: a bogus frame from a frame-pointer walk must not cost a /proc read per sample.
const mapsRereadInterval = time.Second

// Collector aggregates samples per (process, thread, stack) until Flush. It is safe for
// one goroutine adding samples while another flushes.
type Collector struct {
	cfg    Config
	mu     sync.Mutex
	procs  map[uint32]*procState
	files  map[FileKey]*File
	failed map[FileKey]bool
	agg    traceTable
	seed   maphash.Seed
	start  time.Time
	stats  Stats

	chunks *chunker
	epoch  uint64 // counts flushes: a profile lists each location once
	// locations are the locations of cached chunks, one per frame kind, address and
	// mapping, shared by the chunks that hold them.
	locations map[locationKey]*Location
	unheld    []locationKey // locations that lost their last reference since the last flush
	spaces    uint64        // numbers mapping snapshots
	frames    []uint64
	bounds    [][2]int
}

type procState struct {
	proc     *Process
	maps     *snapshot
	readAt   time.Time
	lastSeen time.Time
	// exited processes stay until the next flush: samples taken just before the exit may
	// still be in the ring buffer behind the exit event.
	exited bool
}

// snapshot is one reading of a process's executable mappings, sorted by address. Samples
// keep the snapshot they were taken under, so an exec or a re-read never changes them.
type snapshot struct {
	mappings []*Mapping
	space    uint64 // identifies this reading for chunk interning
}

func (s *snapshot) find(addr uint64) *Mapping {
	i := sort.Search(len(s.mappings), func(i int) bool { return s.mappings[i].Limit > addr })
	if i < len(s.mappings) && s.mappings[i].Start <= addr {
		return s.mappings[i]
	}
	return nil
}

// entry is one distinct (process, thread, stack) of the interval. The stack is a list of
// interned chunks, root first: entries sharing a prefix share its chunks, and an entry keeps
// its chunks alive whatever the cache evicts until the interval is flushed.
type entry struct {
	proc   *Process
	maps   *snapshot
	tid    uint32
	comm   string
	chunks []*chunk
	times  []time.Time
}

// NewCollector starts an empty aggregation whose first interval begins at start.
func NewCollector(cfg Config, start time.Time) (*Collector, error) {
	if cfg.ProcFS == "" {
		cfg.ProcFS = "/proc"
	}
	chunks, err := newChunker(cmp.Or(cfg.ChunkSize, DefaultChunkSize), cmp.Or(cfg.ChunkCapacity, DefaultChunkCapacity))
	if err != nil {
		return nil, err
	}
	c := &Collector{
		chunks: chunks,
		cfg:    cfg,
		procs:  map[uint32]*procState{},
		files:  map[FileKey]*File{},
		failed: map[FileKey]bool{},
		start:  start.Round(0),
		agg:    newTraceTable(0),
		seed:   maphash.MakeSeed(),

		locations: map[locationKey]*Location{},
	}
	chunks.onEvict = c.release
	return c, nil
}

// Add counts one sample.
func (c *Collector) Add(s RawSample) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Samples++
	// A sample taken just before a flush but read just after it counts in the new
	// interval; its time moves to the interval's start (by the read latency, microseconds)
	// so that every timestamp lies inside its profile.
	if s.Time.Before(c.start) {
		s.Time = c.start
	}
	ps := c.process(s.PID, s.Comm)
	ps.lastSeen = s.Time
	c.aggregate(ps, s)
}

// aggregate counts the sample's stack in the interval. Most samples repeat a stack already
// counted: they cost one 128-bit hash of the frames and one probe of the table. Only a
// stack new to the interval has its addresses checked against the mappings, and is cut
// into chunks and interned.
func (c *Collector) aggregate(ps *procState, s RawSample) {
	// The stack, leaf first: kernel frames, then user frames. Most samples of a --pid
	// target have no kernel part, and need no copy.
	frames := s.User
	if len(s.Kernel) > 0 {
		c.frames = append(append(c.frames[:0], s.Kernel...), s.User...)
		frames = c.frames
	}
	id := c.traceID(ps.maps.space, s.TID, s.Comm, frames)
	if sl := c.agg.find(id); sl != nil {
		sl.count++
		if c.cfg.KeepTimestamps {
			sl.e.times = append(sl.e.times, s.Time)
		}
		return
	}
	// A repeat of this stack was checked when it was first seen, under the same reading
	// of the mappings; a new reading starts new entries, checked again.
	if c.hasUnknownAddress(ps.maps, s.User) && time.Since(ps.readAt) >= mapsRereadInterval {
		c.readMaps(ps)
		id = c.traceID(ps.maps.space, s.TID, s.Comm, frames)
	}
	c.bounds = chunkBounds(len(frames), c.chunks.size, c.bounds)
	e := &entry{proc: ps.proc, maps: ps.maps, tid: s.TID, comm: s.Comm, chunks: make([]*chunk, len(c.bounds))}
	for i, b := range c.bounds {
		run := frames[b[0]:b[1]]
		e.chunks[i] = c.chunks.intern(ps.maps.space, c.chunks.hashFrames(ps.maps.space, run), run)
	}
	if c.cfg.KeepTimestamps {
		e.times = []time.Time{s.Time}
	}
	c.agg.insert(id, e)
}

// traceID identifies a stack of a thread in an interval. It is not checked frame by frame:
// two distinct stacks share an ID only if 128-bit hashes collide, which for n distinct
// stacks in an interval happens with probability about n²/2¹²⁹ (below 10⁻²⁶ for a
// million stacks), far below the sampling error of the profile itself. Skipping the check
// halves the cost of the samples that repeat a stack, which are most of them.
//
// The ID hashes the frames rather than the list of their chunks: the list follows from
// the frames, and a repeat then never touches the chunk cache.
type traceID xxh3.Uint128

func (c *Collector) traceID(space uint64, tid uint32, comm string, frames []uint64) traceID {
	var h xxh3.Uint128
	if len(frames) > 0 {
		h = xxh3.Hash128(unsafe.Slice((*byte)(unsafe.Pointer(&frames[0])), len(frames)*8))
	}
	// The frames' hash is uniform, so XOR-ing in an injective function of the thread
	// keeps every (thread, frames) pair apart but for the collision odds above. Spaces
	// number snapshots from 1 and stay far below 2³², so space<<32|tid is injective,
	// and so is mix. A thread that renames itself starts a new entry: its name goes in
	// the other half.
	return traceID{Hi: h.Hi ^ maphash.String(c.seed, comm), Lo: h.Lo ^ mix(space<<32|uint64(tid))}
}

// traceTable holds the interval's entries by trace ID: open addressing on the ID's low
// half, already uniform. A repeat reads one slot of a flat array and nothing else.
type traceTable struct {
	slots []traceSlot
	n     int
}

type traceSlot struct {
	id    traceID
	count int64
	e     *entry
}

func newTraceTable(expect int) traceTable {
	size := 64
	for size < 2*expect {
		size *= 2
	}
	return traceTable{slots: make([]traceSlot, size)}
}

func (t *traceTable) find(id traceID) *traceSlot {
	mask := uint64(len(t.slots) - 1)
	for i := id.Lo & mask; ; i = (i + 1) & mask {
		sl := &t.slots[i]
		if sl.e == nil {
			return nil
		}
		if sl.id == id {
			return sl
		}
	}
}

func (t *traceTable) insert(id traceID, e *entry) {
	if 2*(t.n+1) > len(t.slots) {
		old := t.slots
		*t = newTraceTable(t.n + 1)
		for _, sl := range old {
			if sl.e != nil {
				*t.place(sl.id) = sl
				t.n++
			}
		}
	}
	*t.place(id) = traceSlot{id: id, count: 1, e: e}
	t.n++
}

// place returns the free slot where id belongs.
func (t *traceTable) place(id traceID) *traceSlot {
	mask := uint64(len(t.slots) - 1)
	i := id.Lo & mask
	for t.slots[i].e != nil {
		i = (i + 1) & mask
	}
	return &t.slots[i]
}

func (c *Collector) hasUnknownAddress(s *snapshot, addrs []uint64) bool {
	for _, a := range addrs {
		if s.find(a) == nil {
			return true
		}
	}
	return false
}

// process returns the state of pid, reading /proc the first time it is seen.
func (c *Collector) process(pid uint32, comm string) *procState {
	if ps, ok := c.procs[pid]; ok {
		return ps
	}
	dir := filepath.Join(c.cfg.ProcFS, strconv.FormatUint(uint64(pid), 10))
	proc := &Process{PID: pid, Name: comm}
	if b, err := os.ReadFile(filepath.Join(dir, "comm")); err == nil {
		proc.Name = strings.TrimSuffix(string(b), "\n")
	}
	if exe, err := os.Readlink(filepath.Join(dir, "exe")); err == nil {
		proc.ExePath = strings.TrimSuffix(exe, " (deleted)")
	}
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup")); err == nil {
		proc.ContainerID = containerID(b)
	}
	c.spaces++
	ps := &procState{proc: proc, maps: &snapshot{space: c.spaces}}
	c.readMaps(ps)
	c.procs[pid] = ps
	return ps
}

// readMaps replaces the process's snapshot with a fresh reading of /proc/PID/maps.
func (c *Collector) readMaps(ps *procState) {
	ps.readAt = time.Now()
	c.stats.MapsReads++
	pid := strconv.FormatUint(uint64(ps.proc.PID), 10)
	f, err := os.Open(filepath.Join(c.cfg.ProcFS, pid, "maps"))
	if err != nil {
		c.stats.MapsErrors++
		return
	}
	defer f.Close()
	lines, err := parseMaps(bufio.NewReader(f))
	if err != nil {
		c.stats.MapsErrors++
		return
	}
	c.spaces++
	snap := &snapshot{mappings: make([]*Mapping, 0, len(lines)), space: c.spaces}
	for _, l := range lines {
		m := &Mapping{Start: l.Start, Limit: l.Limit, Offset: l.Offset, Path: l.Path}
		if l.Inode != 0 && strings.HasPrefix(l.Path, "/") {
			m.File = c.file(pid, l)
		}
		snap.mappings = append(snap.mappings, m)
	}
	ps.maps = snap
	if c.cfg.Observer != nil {
		c.cfg.Observer.ProcessMappings(ps.proc.PID, snap.mappings)
	}
}

// file returns the shared description of a mapped file, identifying it on first sight.
func (c *Collector) file(pid string, l mapsLine) *File {
	key := FileKey{Dev: l.Dev, Inode: l.Inode}
	path := strings.TrimSuffix(l.Path, " (deleted)")
	viaRoot := filepath.Join(c.cfg.ProcFS, pid, "root", path)
	// map_files reaches the very inode mapped, also when it was deleted, replaced, or is a
	// memfd with no path at all; it lasts as long as the process.
	byRange := filepath.Join(c.cfg.ProcFS, pid, "map_files", fmt.Sprintf("%x-%x", l.Start, l.Limit))
	if f, ok := c.files[key]; ok {
		f.addOpenPath(viaRoot)
		return f
	}
	f := NewFile(key, path, byRange, viaRoot, path)
	if err := identify(f); err != nil && !c.failed[key] {
		c.failed[key] = true
		c.stats.FileErrors++
		if c.cfg.OnFileError != nil {
			c.cfg.OnFileError(path, err)
		}
	}
	c.files[key] = f
	return f
}

func identify(f *File) error {
	file, err := f.Open()
	if err != nil {
		return err
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %w", f.Path, err)
	}
	id, err := readIdentity(file, st.Size())
	if err != nil {
		return fmt.Errorf("identify %s: %w", f.Path, err)
	}
	f.GNUBuildID, f.GoBuildID, f.HTLHash, f.IsGo = id.GNUBuildID, id.GoBuildID, id.HTLHash, id.IsGo
	return nil
}

// containerIDPattern matches the 64-hex-digit IDs that docker, containerd and cri-o put in
// cgroup paths (…/docker-<id>.scope, …/cri-containerd-<id>.scope, …/<id>).
var containerIDPattern = regexp.MustCompile(`[0-9a-f]{64}`)

// containerID extracts a container ID from /proc/PID/cgroup, or "" outside containers.
func containerID(cgroup []byte) string {
	for _, line := range bytes.Split(cgroup, []byte("\n")) {
		parts := bytes.SplitN(line, []byte(":"), 3)
		if len(parts) != 3 {
			continue
		}
		if ids := containerIDPattern.FindAll(parts[2], -1); len(ids) > 0 {
			return string(ids[len(ids)-1])
		}
	}
	return ""
}

// ProcessExec forgets what was known of pid: its mappings and name changed. Samples
// already counted keep the snapshot they were taken under.
func (c *Collector) ProcessExec(pid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forget(pid)
}

func (c *Collector) forget(pid uint32) {
	if _, ok := c.procs[pid]; !ok {
		return
	}
	delete(c.procs, pid)
	if c.cfg.Observer != nil {
		c.cfg.Observer.ProcessGone(pid)
	}
}

// Prime reads a process's mappings before its first sample, so the first samples of a
// process named in advance are unwound with its tables.
func (c *Collector) Prime(pid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.process(pid, "").lastSeen = time.Now()
}

// ProcessExit marks pid for removal at the next flush.
func (c *Collector) ProcessExit(pid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ps, ok := c.procs[pid]; ok {
		ps.exited = true
	}
}

// Flush returns what was aggregated since the last flush, resolved to mappings, and starts
// a new interval at end.
func (c *Collector) Flush(end time.Time) *Profile {
	// Interval bounds are wall-clock only: timestamps and bounds are compared and
	// subtracted by consumers, and a monotonic reading in one of them would make
	// durations and timestamps disagree by the clocks' drift.
	end = end.Round(0)
	c.mu.Lock()
	defer c.mu.Unlock()
	agg, start := c.agg, c.start
	// The next interval likely sees as many stacks: sizing for them spares the rehashes.
	c.agg, c.start = newTraceTable(c.agg.n), end
	c.forgetIdle(start)
	c.epoch++

	p := &Profile{Start: start, End: end, Period: c.cfg.Period}
	for _, sl := range agg.slots {
		if sl.e != nil {
			p.Samples = append(p.Samples, c.sample(p, sl.e, sl.count))
		}
	}
	c.forgetUnheld()
	return p
}

// resolve returns the chunk's locations, resolving its frames the first time, and lists
// in p those that p does not list yet.
func (c *Collector) resolve(p *Profile, ch *chunk, maps *snapshot) []*Location {
	if ch.locs == nil {
		ch.locs = make([]*Location, len(ch.frames))
		for i, a := range ch.frames {
			kind, m := FrameKernel, c.cfg.Kernel
			if !c.isKernel(a) {
				kind, m = FrameNative, maps.find(a)
				if m == nil {
					c.stats.UnresolvedFrames++
				} else if m.File != nil && m.File.IsGo {
					kind = FrameGo
				}
			}
			ch.locs[i] = c.location(locationKey{addr: a, mapping: m, kind: kind}, ch.cached)
		}
	}
	if ch.listed != c.epoch {
		ch.listed = c.epoch
		for _, l := range ch.locs {
			if l.listed != c.epoch {
				l.listed = c.epoch
				p.Locations = append(p.Locations, l)
			}
		}
	}
	return ch.locs
}

// location returns the one location of a frame, shared by every chunk with that frame.
// Cached chunks hold references; a location no cached chunk holds stays until the end of
// the next flush, so that chunks evicted while their stacks were counted still share it
// with the rest: a profile never has two locations for one frame.
func (c *Collector) location(k locationKey, cached bool) *Location {
	l, ok := c.locations[k]
	if !ok {
		l = &Location{Kind: k.kind, Address: k.addr, Mapping: k.mapping}
		c.locations[k] = l
		if !cached {
			c.unheld = append(c.unheld, k)
		}
	}
	if cached {
		l.refs++
	}
	return l
}

// release drops an evicted chunk's references.
func (c *Collector) release(ch *chunk) {
	for _, l := range ch.locs {
		if l.refs--; l.refs == 0 {
			c.unheld = append(c.unheld, locationKey{addr: l.Address, mapping: l.Mapping, kind: l.Kind})
		}
	}
}

// forgetUnheld drops the locations no cached chunk took up again since they were let go.
func (c *Collector) forgetUnheld() {
	for _, k := range c.unheld {
		if l, ok := c.locations[k]; ok && l.refs == 0 {
			delete(c.locations, k)
		}
	}
	c.unheld = c.unheld[:0]
}

// sample turns an entry into the Sample it reports, its chunks resolved to locations.
func (c *Collector) sample(p *Profile, e *entry, count int64) *Sample {
	n := 0
	for _, ch := range e.chunks {
		n += len(ch.frames)
	}
	s := &Sample{
		Process:    e.proc,
		TID:        e.tid,
		ThreadName: e.comm,
		Count:      count,
		Timestamps: e.times,
		Locations:  make([]*Location, 0, n),
		Chunks:     make([][]*Location, 0, len(e.chunks)),
	}
	for i := len(e.chunks) - 1; i >= 0; i-- { // leaf chunk first
		locs := c.resolve(p, e.chunks[i], e.maps)
		s.Chunks = append(s.Chunks, locs)
		s.Locations = append(s.Locations, locs...)
	}
	return s
}

// kernelStart is where the kernel half of the address space begins on amd64 and arm64.
const kernelStart = 0xffff800000000000

func (c *Collector) isKernel(addr uint64) bool {
	if c.cfg.Kernel != nil {
		return addr >= c.cfg.Kernel.Start
	}
	return addr >= kernelStart
}

type locationKey struct {
	addr    uint64
	mapping *Mapping
	kind    FrameKind
}

// forgetIdle drops processes not sampled since the interval began, and files no remaining
// process maps, so memory follows what is running now rather than everything ever seen.
func (c *Collector) forgetIdle(intervalStart time.Time) {
	for pid, ps := range c.procs {
		if ps.exited || ps.lastSeen.Before(intervalStart) {
			c.forget(pid)
		}
	}
	live := make(map[FileKey]*File, len(c.files))
	for _, ps := range c.procs {
		for _, m := range ps.maps.mappings {
			if m.File != nil {
				live[m.File.Key] = m.File
			}
		}
	}
	c.files = live
	// Failures are remembered longer than files so a broken file is reported once, not
	// once per interval; the bound keeps a host full of broken files from growing it forever.
	if len(c.failed) > maxRememberedFailures {
		clear(c.failed)
	}
}

const maxRememberedFailures = 4096

// Stats returns the counters so far.
func (c *Collector) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stats
	st.Processes, st.Files = len(c.procs), len(c.files)
	st.Traces, st.Chunks, st.Locations = c.agg.n, c.chunks.lru.Len(), len(c.locations)
	m := c.chunks.lru.Metrics()
	st.ChunkHits, st.ChunkMisses, st.ChunkEvictions, st.ChunkCollisions = m.Hits, m.Misses, m.Evictions, c.chunks.collisions
	return st
}
