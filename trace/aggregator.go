package trace

import (
	"cmp"
	"context"
	"hash/maphash"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// RawSample is one sample as the kernel recorded it. The aggregator copies what it keeps,
// so the slices may alias a reused buffer.
type RawSample struct {
	PID, TID uint32
	// ExecID is the process's self_exec_id: which of its execs the addresses belong to;
	// 0 when unknown.
	ExecID uint64
	Comm   string
	Time   time.Time
	User   []uint64 // leaf first
	Kernel []uint64 // leaf first
	// ContextKind says who published Context, the trace context of the thread as the
	// kernel copied it.
	ContextKind ContextKind
	Context     []byte
	// Mappings are those the kernel named for the user frames, when user space had not
	// described the image to it yet.
	Mappings []SampledMapping
	// OffCPU, when positive, makes this an off-CPU sample: the thread waited this long
	// with these stacks, rather than running on a CPU for a period.
	OffCPU time.Duration
}

// Config tunes an Aggregator.
type Config struct {
	// Period is the CPU time one sample stands for.
	Period time.Duration
	// Kernel is the mapping kernel frames belong to; nil leaves them unmapped.
	Kernel *Mapping
	// KeepTimestamps records each sample's time, not only counts.
	KeepTimestamps bool
	// Runtimes decode the frames of language runtimes the kernel wrote, and hear of their
	// code in each stack new to an interval.
	Runtimes Runtimes
	// ChunkSize and ChunkCapacity tune the interning of stack chunks: frames per chunk and
	// chunks kept in the hash-LRU; zero means DefaultChunkSize and DefaultChunkCapacity.
	ChunkSize, ChunkCapacity int
	// MaxLocations bounds the locations the cached chunks hold: a process whose frames keep
	// changing (code compiled without end) makes each chunk's locations its own, and a
	// bound on chunks alone would let them grow many times over. Past it, each flush lets
	// the least recently used chunks go. Zero: no bound but ChunkCapacity's.
	MaxLocations int
	// MaxIdle lets a cached chunk go, with the locations only it held, once no flush
	// has listed it for this long: what code compiled without end leaves behind then
	// stops growing after MaxIdle, not once the bounds above are reached minutes later.
	// A stack seen again later is resolved again, from the symbolizer's and namers'
	// caches. Zero: chunks stay until the bounds push them out.
	MaxIdle time.Duration
}

// Stats counts what the aggregator saw since it started.
type Stats struct {
	Samples          uint64
	UnresolvedFrames uint64 // user addresses outside every known mapping
	Traces           int    // distinct stacks aggregated in the current interval
	Chunks           int    // chunks in the intern cache
	Locations        int    // locations the cached chunks hold
	ChunkHits        uint64
	ChunkMisses      uint64
	ChunkEvictions   uint64
	ChunkCollisions  uint64
	// ChunksForgotten counts cached chunks dropped because their image was forgotten.
	ChunksForgotten uint64
	// Linked counts samples with a trace context that named a span; ContextErrors
	// contexts that were invalid, oversized or torn, which count without one.
	Linked        uint64
	ContextErrors uint64
	// ImagesRenewed counts images given a new space for a reused code object address.
	ImagesRenewed uint64
}

// Aggregator counts samples per (process image, thread, stack) until Flush. It is safe for
// one goroutine adding samples while another flushes. What it knows of processes and
// their mappings it asks of Processes, which reads /proc on a goroutine of its own: adding
// a sample never waits for a file.
type Aggregator struct {
	cfg   Config
	procs *Processes
	mu    sync.Mutex
	agg   traceTable
	seed  maphash.Seed
	start time.Time
	// latest is the latest sample time counted in the interval: a flush that waits for
	// /proc reads keeps counting samples taken after the end it was asked for.
	latest time.Time
	stats  Stats
	// images caches the image each pid was last sampled in, sparing most samples a
	// lookup in Processes.
	images map[uint32]*image

	chunks *chunker
	epoch  uint64 // counts flushes: a profile lists each location once
	// locations are the locations of cached chunks, one per frame kind, address and
	// mapping, shared by the chunks that hold them.
	locations map[locationKey]*Location
	unheld    []locationKey // locations that lost their last reference since the last flush
	held      int           // locations a cached chunk holds
	// flushEnds are the ends of the flushes within MaxIdle of the latest, the first
	// that of flush number flushBase: a chunk last listed before it is idle.
	flushEnds []time.Time
	flushBase uint64
	frames    []uint64
	bounds    [][2]int
}

// entry is one distinct (image, thread, stack) of the interval. The stack is a list of
// interned chunks, root first: entries sharing a prefix share its chunks, and an entry keeps
// its chunks alive whatever the cache evicts until the interval is flushed.
type entry struct {
	img    *image // nil for a process sonde does not track
	pid    uint32
	tid    uint32
	comm   string
	chunks []*chunk
	times  []time.Time
	link   Link
	attrs  []Attribute
}

// NewAggregator starts an empty aggregation whose first interval begins at start; procs
// tells it about processes.
func NewAggregator(cfg Config, procs *Processes, start time.Time) (*Aggregator, error) {
	chunks, err := newChunker(cmp.Or(cfg.ChunkSize, DefaultChunkSize), cmp.Or(cfg.ChunkCapacity, DefaultChunkCapacity))
	if err != nil {
		return nil, err
	}
	a := &Aggregator{
		chunks: chunks,
		cfg:    cfg,
		procs:  procs,
		start:  start.Round(0),
		agg:    newTraceTable(0),
		seed:   maphash.MakeSeed(),
		images: map[uint32]*image{},

		locations: map[locationKey]*Location{},
	}
	chunks.lru.onEvict = a.release
	return a, nil
}

// Add counts one sample.
func (a *Aggregator) Add(s RawSample) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.Samples++
	// A sample taken just before a flush but read just after it counts in the new
	// interval; its time moves to the interval's start (by the read latency, microseconds)
	// so that every timestamp lies inside its profile.
	if s.Time.Before(a.start) {
		s.Time = a.start
	}
	if s.Time.After(a.latest) {
		a.latest = s.Time
	}
	img := a.image(s)
	if len(s.Mappings) > 0 && img != nil {
		a.procs.noteKernelMappings(img, s.Mappings)
	}
	a.aggregate(img, s)
}

// image returns the image the sample was taken in.
func (a *Aggregator) image(s RawSample) *image {
	img := a.images[s.PID]
	if img != nil && (s.ExecID == 0 || img.execID.Load() == s.ExecID) && !img.forgotten.Load() {
		return img
	}
	img = a.procs.current(s.PID, s.ExecID, s.Comm)
	if img == nil {
		delete(a.images, s.PID)
	} else {
		a.images[s.PID] = img
	}
	return img
}

// aggregate counts the sample's stack in the interval. Most samples repeat a stack already
// counted: they cost one 128-bit hash of the frames and one probe of the table. Only a
// stack new to the interval has its addresses checked against the mappings, and is cut
// into chunks and interned.
func (a *Aggregator) aggregate(img *image, s RawSample) {
	// The stack, leaf first: kernel frames, then user frames. Most samples of a --pid
	// target have no kernel part, and need no copy.
	frames := s.User
	if len(s.Kernel) > 0 {
		a.frames = append(append(a.frames[:0], s.Kernel...), s.User...)
		frames = a.frames
	}
	// Untracked processes share space 0 with each other: their user frames stay
	// addresses, whoever ran them.
	var space uint64
	if img != nil {
		space = img.space.Load()
	}
	id := a.traceID(space, s.PID, s.TID, s.Comm, frames)
	if len(s.Context) > 0 {
		// The bytes stand for what they parse to: a repeat is not parsed again.
		h := xxh3.Hash128(s.Context)
		id.Hi ^= h.Hi
		id.Lo ^= h.Lo ^ mix(uint64(s.ContextKind))
	}
	if sl := a.agg.find(id); sl != nil {
		sl.add(s)
		if !sl.e.link.IsZero() {
			a.stats.Linked++
		}
		if a.cfg.KeepTimestamps && s.OffCPU <= 0 {
			sl.e.times = append(sl.e.times, s.Time)
		}
		return
	}
	// A repeat of this stack was checked when it was first seen in the interval; an
	// address no mapping covers asks for a new reading, which the flush resolves against.
	if img != nil && a.hasUnknownAddress(img, s.User) {
		a.procs.reread(img)
	}
	if len(a.cfg.Runtimes) > 0 && img != nil {
		for _, v := range s.User {
			if id, payload, ok := DecodeInterpFrame(v); ok {
				if rt := a.cfg.Runtimes[id]; rt != nil {
					code, _ := rt.DecodeFrame(payload)
					rt.SeenCode(s.PID, space, code)
				}
			}
		}
	}
	a.bounds = chunkBounds(len(frames), a.chunks.size, a.bounds)
	e := &entry{img: img, pid: s.PID, tid: s.TID, comm: strings.ToValidUTF8(s.Comm, "\uFFFD"), chunks: make([]*chunk, len(a.bounds))}
	if a.parseContext(e, img, s); !e.link.IsZero() {
		a.stats.Linked++
	}
	for i, b := range a.bounds {
		run := frames[b[0]:b[1]]
		e.chunks[i] = a.chunks.intern(space, a.chunks.hashFrames(space, run), run)
	}
	if a.cfg.KeepTimestamps && s.OffCPU <= 0 {
		e.times = []time.Time{s.Time}
	}
	a.agg.insert(id, e).add(s)
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

func (a *Aggregator) traceID(space uint64, pid, tid uint32, comm string, frames []uint64) traceID {
	var h xxh3.Uint128
	if len(frames) > 0 {
		h = xxh3.Hash128(unsafe.Slice((*byte)(unsafe.Pointer(&frames[0])), len(frames)*8))
	}
	// The frames' hash is uniform, so XOR-ing in an injective function of the thread
	// keeps every (thread, frames) pair apart but for the collision odds above. Spaces
	// number images from 1 and stay far below 2³², so space<<32|tid is injective, and so
	// is mix. A thread that renames itself starts a new entry: its name goes in the other
	// half, with the pid, which tells untracked processes (space 0) apart.
	return traceID{Hi: h.Hi ^ maphash.String(a.seed, comm) ^ mix(uint64(pid)), Lo: h.Lo ^ mix(space<<32|uint64(tid))}
}

// traceTable holds the interval's entries by trace ID: open addressing on the ID's low
// half, already uniform. A repeat reads one slot of a flat array and nothing else.
type traceTable struct {
	slots []traceSlot
	n     int
}

type traceSlot struct {
	id    traceID
	count int64 // CPU samples
	off   int64 // nanoseconds off the CPU
	e     *entry
}

func (sl *traceSlot) add(s RawSample) {
	if s.OffCPU > 0 {
		sl.off += int64(s.OffCPU)
	} else {
		sl.count++
	}
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

func (t *traceTable) insert(id traceID, e *entry) *traceSlot {
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
	sl := t.place(id)
	*sl = traceSlot{id: id, e: e}
	t.n++
	return sl
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

func (a *Aggregator) hasUnknownAddress(img *image, addrs []uint64) bool {
	snap := img.maps.Load()
	if snap == nil {
		return false // its first reading is on its way
	}
	for _, addr := range addrs {
		if _, _, interp := DecodeInterpFrame(addr); !interp && snap.find(addr) == nil {
			return true
		}
	}
	return false
}

// Flush returns what was aggregated since the last flush, resolved to mappings, and starts
// a new interval at end. It first waits, briefly, for the reads of /proc already asked
// for, so that processes seen just before the flush are resolved.
func (a *Aggregator) Flush(end time.Time) *Profile {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	a.procs.Settle(ctx)
	cancel()
	// Interval bounds are wall-clock only: timestamps and bounds are compared and
	// subtracted by consumers, and a monotonic reading in one of them would make
	// durations and timestamps disagree by the clocks' drift.
	end = end.Round(0)
	a.mu.Lock()
	agg, start := a.agg, a.start
	// Samples counted while the flush settled may be later than the end asked for: the
	// interval stretches to hold them, and the next one starts there. Where that put
	// start past the end asked for now, the interval lasts no time rather than a
	// negative one.
	if !a.latest.Before(end) {
		end = a.latest.Add(time.Nanosecond)
	}
	if end.Before(start) {
		end = start
	}
	// The next interval likely sees as many stacks: sizing for them spares the rehashes.
	a.agg, a.start = newTraceTable(a.agg.n), end
	a.epoch++

	p := &Profile{Start: start, End: end, Period: a.cfg.Period}
	seen := map[*image]bool{}
	for _, sl := range agg.slots {
		if sl.e != nil {
			smp := a.sample(p, sl.e, sl.count)
			smp.OffCPU = sl.off
			p.Samples = append(p.Samples, smp)
			seen[sl.e.img] = true
		}
	}
	for a.cfg.MaxLocations > 0 && a.held > a.cfg.MaxLocations && a.chunks.lru.len() > 0 {
		a.chunks.lru.remove(a.chunks.lru.oldest())
		a.chunks.evictions++
	}
	a.forgetIdle(end)
	a.forgetUnheld()
	// What the forgetting let go of, this flush's or the last one's exited spaces, leaves
	// the table's room too.
	a.chunks.lru.shrink()
	// Images the processes forget must not be handed to later samples.
	clear(a.images)
	a.mu.Unlock()
	if dead := a.procs.sweep(seen, start); len(dead) > 0 {
		a.mu.Lock()
		a.stats.ChunksForgotten += uint64(a.chunks.forgetSpaces(dead))
		a.mu.Unlock()
	}
	return p
}

// settleTimeout bounds how long a flush waits for /proc reads in flight.
const settleTimeout = 200 * time.Millisecond

// resolve returns the chunk's locations, resolving its frames the first time, and lists
// in p those that p does not list yet. Frames that no reading covered are tried again
// once the image has a newer reading.
func (a *Aggregator) resolve(p *Profile, ch *chunk, img *image) []*Location {
	var snap *snapshot
	if img != nil {
		snap = img.maps.Load()
	}
	if ch.locs == nil || (ch.unresolved > 0 && snap != ch.resolvedWith) {
		if ch.locs == nil {
			ch.locs = make([]*Location, len(ch.frames))
		}
		ch.unresolved, ch.resolvedWith = 0, snap
		for i, addr := range ch.frames {
			if l := ch.locs[i]; l != nil && (l.Kind == FrameKernel || l.Kind == FrameInterp || l.Mapping != nil) {
				continue
			}
			if id, payload, ok := DecodeInterpFrame(addr); ok {
				// A runtime's code means something in its image only.
				var pid uint32
				if img != nil {
					pid = img.pid
				}
				k := locationKey{addr: addr, kind: FrameInterp, space: ch.space}
				ch.locs[i] = a.location(k, ch.cached)
				if ch.locs[i].Interp == nil {
					ch.locs[i].Interp = a.interpFrame(id, payload, pid, ch.space, addr)
					ch.locs[i].Address = ch.locs[i].Interp.Code
				}
				continue
			}
			kind, m := FrameKernel, a.cfg.Kernel
			if !a.isKernel(addr) {
				kind, m = FrameNative, nil
				if img != nil {
					m = img.find(addr)
				}
				switch {
				case m == nil:
					a.stats.UnresolvedFrames++
					ch.unresolved++
				case m.File != nil && m.File.IsGo:
					kind = FrameGo
				}
			}
			old := ch.locs[i]
			ch.locs[i] = a.location(locationKey{addr: addr, mapping: m, kind: kind}, ch.cached)
			if old != nil && ch.cached {
				a.drop(old)
			}
		}
	}
	if ch.listed != a.epoch {
		ch.listed = a.epoch
		for _, l := range ch.locs {
			if l.listed != a.epoch {
				l.listed = a.epoch
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
func (a *Aggregator) location(k locationKey, cached bool) *Location {
	l, ok := a.locations[k]
	if !ok {
		l = &Location{Kind: k.kind, Address: k.addr, Mapping: k.mapping}
		a.locations[k] = l
		if !cached {
			a.unheld = append(a.unheld, k)
		}
	}
	if cached {
		if l.refs == 0 {
			a.held++
		}
		l.refs++
	}
	return l
}

// drop releases one cached chunk's reference to a location.
func (a *Aggregator) drop(l *Location) {
	if l.refs--; l.refs == 0 {
		a.held--
		a.unheld = append(a.unheld, l.key())
	}
}

// release drops an evicted chunk's references.
func (a *Aggregator) release(ch *chunk) {
	for _, l := range ch.locs {
		a.drop(l)
	}
}

// forgetIdle lets the chunks no flush listed within MaxIdle of end go, oldest first: the
// cache's order is that of use, so the walk stops at the first chunk still listed.
func (a *Aggregator) forgetIdle(end time.Time) {
	if a.cfg.MaxIdle <= 0 {
		return
	}
	if len(a.flushEnds) == 0 {
		a.flushBase = a.epoch
	}
	a.flushEnds = append(a.flushEnds, end)
	cut := end.Add(-a.cfg.MaxIdle)
	old := 0
	for old < len(a.flushEnds)-1 && a.flushEnds[old].Before(cut) {
		old++
	}
	a.flushEnds = slices.Delete(a.flushEnds, 0, old)
	a.flushBase += uint64(old)
	for ch := a.chunks.lru.oldest(); ch != nil && ch.listed < a.flushBase; ch = a.chunks.lru.oldest() {
		a.chunks.lru.remove(ch)
		a.chunks.evictions++
	}
}

// forgetUnheld drops the locations no cached chunk took up again since they were let go.
func (a *Aggregator) forgetUnheld() {
	for _, k := range a.unheld {
		if l, ok := a.locations[k]; ok && l.refs == 0 {
			delete(a.locations, k)
		}
	}
	a.unheld = a.unheld[:0]
}

// sample turns an entry into the Sample it reports, its chunks resolved to locations.
func (a *Aggregator) sample(p *Profile, e *entry, count int64) *Sample {
	n := 0
	for _, ch := range e.chunks {
		n += len(ch.frames)
	}
	s := &Sample{
		Process:    e.process(),
		TID:        e.tid,
		ThreadName: e.comm,
		Count:      count,
		Timestamps: e.times,
		Link:       e.link,
		Attributes: e.attrs,
		Locations:  make([]*Location, 0, n),
		Chunks:     make([][]*Location, 0, len(e.chunks)),
	}
	for i := len(e.chunks) - 1; i >= 0; i-- { // leaf chunk first
		locs := a.resolve(p, e.chunks[i], e.img)
		s.Chunks = append(s.Chunks, locs)
		s.Locations = append(s.Locations, locs...)
	}
	return s
}

// process describes the entry's process: as read from /proc, or as the sample named it
// when /proc could not be read.
func (e *entry) process() *Process {
	if e.img != nil {
		if p := e.img.proc.Load(); p != nil {
			return p
		}
	}
	return &Process{PID: e.pid, Name: e.comm}
}

func (a *Aggregator) isKernel(addr uint64) bool {
	if a.cfg.Kernel != nil {
		return addr >= a.cfg.Kernel.Start
	}
	return addr >= KernelStart
}

type locationKey struct {
	addr    uint64
	mapping *Mapping
	kind    FrameKind
	space   uint64 // interpreted frames: the image their code belongs to
}

// key is the key the location was made for.
func (l *Location) key() locationKey {
	if l.Interp != nil {
		return locationKey{addr: l.Interp.raw, kind: l.Kind, space: l.Interp.Image}
	}
	return locationKey{addr: l.Address, mapping: l.Mapping, kind: l.Kind}
}

// interpFrame describes a runtime's frame by its runtime's own decoding; a runtime no one
// registered keeps its payload as the code's identity, under the generic kind.
func (a *Aggregator) interpFrame(id uint8, payload uint64, pid uint32, space, raw uint64) *InterpFrame {
	f := &InterpFrame{Runtime: id, PID: pid, Image: space, Code: payload, raw: raw}
	if rt := a.cfg.Runtimes[id]; rt != nil {
		f.Type = rt.FrameType()
		f.Code, f.Offset = rt.DecodeFrame(payload)
	}
	return f
}

// RenewImage gives pid's image a new space for interning if space is still its own, so
// that its stacks get locations of their own from now on: the interpreter it runs gave a
// freed code object's address to another one, whose frames the old locations, named after
// the old one, must not take. Safe from any goroutine.
func (a *Aggregator) RenewImage(pid uint32, space uint64) {
	a.procs.mu.Lock()
	img := a.procs.images[pid]
	renewed := img != nil && img.space.CompareAndSwap(space, a.procs.spaces.Add(1))
	if renewed {
		a.procs.replaced = append(a.procs.replaced, space)
	}
	a.procs.mu.Unlock()
	if renewed {
		a.mu.Lock()
		a.stats.ImagesRenewed++
		a.mu.Unlock()
	}
}

// Stats returns the counters so far.
func (a *Aggregator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.stats
	st.Traces, st.Chunks, st.Locations = a.agg.n, a.chunks.lru.len(), len(a.locations)
	c := a.chunks
	st.ChunkHits, st.ChunkMisses, st.ChunkEvictions, st.ChunkCollisions = c.hits, c.misses, c.evictions, c.collisions
	return st
}

func (s Stats) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Uint64("samples", s.Samples), slog.Int("chunks", s.Chunks), slog.Int("locations", s.Locations),
		slog.Uint64("chunk_hits", s.ChunkHits), slog.Uint64("chunk_misses", s.ChunkMisses), slog.Uint64("chunk_evictions", s.ChunkEvictions), slog.Uint64("chunks_forgotten", s.ChunksForgotten),
		slog.Uint64("unresolved_frames", s.UnresolvedFrames), slog.Uint64("linked", s.Linked), slog.Uint64("context_errors", s.ContextErrors),
		slog.Uint64("images_renewed", s.ImagesRenewed))
}
