package trace

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sonde-profiler/sonde/internal/cgroup"
	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/tracectx"
)

// ProcessConfig tunes Processes.
type ProcessConfig struct {
	// ProcFS is where proc is mounted; "/proc" when empty.
	ProcFS string
	// OnFileError is told, once per file, why a mapped file could not be identified.
	OnFileError func(path string, err error)
	// Observer, when set, hears of every new reading of a process's mappings and of
	// processes forgotten: the kernel unwinder's tables follow them.
	Observer MappingObserver
	// ExecIDs, when set, tells which exec a process is at now, so that a reading of its
	// mappings made after it exec'd again is not taken for the exec it was made for.
	ExecIDs ExecIDs
	// Pinned processes are kept however idle: the targets named on the command line.
	Pinned []uint32
	// IdleFor is how long a live process no sample showed stays tracked: at least until
	// the end of the interval after its last sample, when 0. A process that runs once in a
	// while (a collector receiving an export, an agent's own flush) is then not read
	// again, its mappings sent to the kernel again, each time it comes back. With three
	// quarters of MaxProcesses tracked, idle processes go after one interval again.
	IdleFor time.Duration
	// MaxProcesses bounds the processes tracked at once; 0 means DefaultMaxProcesses.
	MaxProcesses int
	// MaxPendingReads bounds the reads of /proc waiting to be done; 0 means
	// DefaultMaxPendingReads. Requests beyond it are dropped and counted.
	MaxPendingReads int
	// ExecReadsPerSecond bounds the mappings read at exec, before a process is sampled:
	// they capture short-lived processes, but a host running thousands of execs a second
	// must not cost a /proc read each. 0 means DefaultExecReadsPerSecond, less than 0 none.
	ExecReadsPerSecond int
	// ExecGrace delays the read at exec: a process gone by then (most of an exec storm's:
	// /bin/true, sh -c, exec probes live a few milliseconds) is never read; one sampled
	// meanwhile is read at its first sample, as one the rate limit skipped. 0 reads at
	// once, for runs that want every child's first samples whole (sonde record).
	ExecGrace time.Duration
	// Describer, when set, adds resource attributes to each process read.
	Describer Describer
	// Contexts, when set, has each process's trace context read (package tracectx): its
	// OpenTelemetry process context becomes Process.Published, and Contexts hears where
	// the kernel finds its threads' context.
	Contexts ContextObserver
}

// ContextObserver follows where processes publish their threads' trace context. Its
// methods are called from the goroutine that reads /proc.
type ContextObserver interface {
	// TraceContext says where pid's threads publish their context since the exec execID;
	// the zero tracectx.Kernel: nowhere.
	TraceContext(pid uint32, execID uint64, k tracectx.Kernel)
	// TraceContextGone says pid is no longer tracked.
	TraceContextGone(pid uint32)
}

// Describer adds what sonde knows of a process from elsewhere (Kubernetes, the service it
// is) to its Attributes. It returns false when it could not say everything it will be
// able to later, and is asked again at the next flush, on a copy.
type Describer interface {
	Describe(p *Process) (complete bool)
}

// Defaults of ProcessConfig.
const (
	DefaultMaxProcesses       = 8192
	DefaultMaxPendingReads    = 4096
	DefaultExecReadsPerSecond = 500
)

// MappingObserver follows the processes Processes tracks. Its methods are called from
// the goroutine that reads /proc and must not block it for long.
type MappingObserver interface {
	// ProcessMappings gives a process's executable mappings, sorted by address, as read
	// after the exec execID (0: unknown).
	ProcessMappings(pid uint32, execID uint64, mappings []*Mapping)
	// ProcessGone says pid is no longer tracked.
	ProcessGone(pid uint32)
}

// ExecIDs reports the self_exec_id of a process's latest exec; ok is false when it has
// not exec'd since sonde started watching.
type ExecIDs interface {
	ExecID(pid uint32) (id uint64, ok bool, err error)
}

// ProcessStats counts what Processes did since it started.
type ProcessStats struct {
	MapsReads  uint64 // readings of /proc/PID/maps
	MapsErrors uint64 // readings that failed, mostly processes that already exited
	// MapsStale counts readings dropped because the process had exec'd again by then.
	MapsStale uint64
	// ReadsDropped counts requests to read a process that found the queue full.
	ReadsDropped uint64
	// ExecReadsSkipped counts execs not read at once for the rate limit; they are read
	// when first sampled.
	ExecReadsSkipped uint64
	// ExecGraceSkipped counts execs whose process was gone, or read at a sample, when the
	// grace before their read ended (ProcessConfig.ExecGrace): reads saved.
	ExecGraceSkipped uint64
	// Untracked counts samples of processes beyond MaxProcesses: they keep addresses only.
	Untracked uint64
	// KernelMappings counts mappings learnt from the kernel for images not read yet;
	// KernelMappingsUnknown those whose file no reading had identified, left out.
	KernelMappings, KernelMappingsUnknown uint64
	FileErrors                            uint64 // mapped files that could not be identified, for any of the reasons below or another
	// Files refused by what they turned out to be: not a regular file (a FIFO, device,
	// socket or directory where the mapped file was), another file than the one mapped,
	// too large, on FUSE, or whose open stalled.
	FilesNotRegular, FilesReplaced, FilesTooLarge, FilesFUSE, FilesStalled uint64
	// Contexts counts what the trace context reader found.
	Contexts  tracectx.ReaderStats
	Processes int // processes tracked now
	Files     int // files tracked now
	Pending   int // reads waiting now
}

// Re-reading a process's maps because addresses miss every mapping is rate-limited per
// image: a bogus frame from a frame-pointer walk must not cost a /proc read per sample.
// A few re-reads may come at once, so that code mapped right after a reading (a dynamic
// program's libraries after its exec was read, a dlopen soon after start) is found at
// once; then one a second.
const (
	rereadBurst = 3
	rereadRate  = 1.0 // per second
)

// maxExecMappings bounds the executable mappings kept per reading: JIT-heavy processes
// can have thousands, of which the kernel unwinder knows a few hundred anyway.
const maxExecMappings = 4096

// Processes tracks the processes sonde samples and the files they map, apart from the
// counting of samples: one goroutine (Run) reads /proc and identifies files, fed by exec
// and exit events and by samples of unknown processes or addresses; the sample path only
// looks up what it has published. Each exec of a process is an image of its own, so
// samples are resolved against the mappings of the program that was running when they
// were taken.
type Processes struct {
	cfg     ProcessConfig
	procFS  string
	pinned  map[uint32]bool
	spaces  atomic.Uint64 // numbers images
	rootDev objfile.Key   // sonde's own root directory, to tell which processes share it

	mu     sync.Mutex
	images map[uint32]*image
	// graced are the images whose exec's grace runs, oldest first, and graceArmed says a
	// timer will look at them: one timer for a burst of execs, not one each.
	graced     []gracedImage
	graceArmed bool
	queue      []uint32 // pids with pending reads, oldest first
	pending    map[uint32]bool
	files      map[objfile.Key]*objfile.File
	failed     map[objfile.Key]bool
	stats      ProcessStats
	tokens     float64 // exec reads the rate limit allows now
	refill     time.Time
	queued     uint64 // requests enqueued so far
	done       uint64 // requests handled so far
	settled    *sync.Cond
	// checks are pids whose trace context is to be looked at again, without a new
	// reading of their mappings; contexts reads them, on Run's goroutine only.
	checks   []uint32
	checking map[uint32]bool
	// replaced are the spaces given up since the last sweep: of images an exec replaced,
	// and those an interpreter image renewed.
	replaced []uint64
	contexts *tracectx.Reader

	wake chan struct{}
}

// image is one exec of a process: samples taken while it ran are resolved against its
// readings of /proc/PID/maps.
type image struct {
	pid    uint32
	execID atomic.Uint64 // 0 until known
	// space identifies the image for chunk interning; renewed when the interpreter it
	// runs reused a code object's address (Aggregator.RenewImage).
	space atomic.Uint64
	proc  atomic.Pointer[Process]
	maps  atomic.Pointer[snapshot] // the latest reading; nil until read
	// kernel holds the mappings the kernel named for samples taken before the image was
	// read: sorted, at most maxKernelMappings, written on the sample path only.
	kernel atomic.Pointer[snapshot]
	comm   string // the thread name it was first seen with

	exited    atomic.Bool
	forgotten atomic.Bool // no longer tracked: samples of pid start a new image
	described atomic.Bool // the Describer said all it could
	requested atomic.Bool // a read is queued or running
	createdAt time.Time
	// sampledIn is the start of the last interval that sampled the image (sweep only).
	sampledIn time.Time
	// ctx is what was read of the image's trace context; nil until the first look.
	// ctxCheckAt is when it was last looked at (Run's goroutine only).
	ctx        atomic.Pointer[tracectx.State]
	ctxCheckAt time.Time
	// rereads is the re-reads the rate limit allows now, as of rereadAt; followUps the
	// reads after its exec still to come. Guarded by Processes.mu.
	rereads   float64
	rereadAt  time.Time
	followUps int
}

// snapshot is one reading of an image's executable mappings, sorted by address.
type snapshot struct {
	mappings []*Mapping
	prev     *snapshot // the image's reading before this one
}

func (s *snapshot) find(addr uint64) *Mapping {
	i, _ := slices.BinarySearchFunc(s.mappings, addr, func(m *Mapping, a uint64) int {
		if m.End <= a {
			return -1
		}
		return 1
	})
	if i < len(s.mappings) && s.mappings[i].Start <= addr {
		return s.mappings[i]
	}
	return nil
}

// find resolves an address against the image's latest reading, then earlier ones: a
// library the latest reading lacks was unmapped since, and the sample came before.
func (img *image) find(addr uint64) *Mapping {
	for s := img.maps.Load(); s != nil; s = s.prev {
		if m := s.find(addr); m != nil {
			return m
		}
	}
	if s := img.kernel.Load(); s != nil {
		return s.find(addr)
	}
	return nil
}

// SampledMapping is an executable mapping the kernel named for the frames of a sample of
// an image it had no mappings of from user space.
type SampledMapping struct {
	Start, End, Offset uint64
	File               objfile.Key // Inode 0: no file
}

// maxKernelMappings bounds the mappings kept per image from the kernel's naming: they
// stand in for a reading that came too late, and a program has a few dozen files at most
// before its reading comes.
const maxKernelMappings = 64

// noteKernelMappings keeps what the kernel named for a sample of img, so that its frames
// resolve even if the image is gone before its maps are read: a program that lives a few
// milliseconds, or one whose reading waits behind a busy host. Their files are those
// earlier readings identified (the same program, its libraries); others are counted and
// left out. Called on the sample path: no I/O.
func (p *Processes) noteKernelMappings(img *image, vmas []SampledMapping) {
	have := img.kernel.Load()
	var add []*Mapping
	p.mu.Lock()
	for _, v := range vmas {
		if v.File.Inode == 0 || v.End <= v.Start || (have != nil && have.find(v.Start) != nil) {
			continue
		}
		f := p.files[v.File]
		if f == nil || p.failed[v.File] {
			p.stats.KernelMappingsUnknown++
			continue
		}
		p.stats.KernelMappings++
		add = append(add, &Mapping{Start: v.Start, End: v.End, Offset: v.Offset, Path: f.Path, File: f})
	}
	p.mu.Unlock()
	if len(add) == 0 {
		return
	}
	next := &snapshot{}
	if have != nil {
		next.mappings = slices.Clone(have.mappings)
	}
	for _, m := range add {
		if len(next.mappings) >= maxKernelMappings {
			break
		}
		i, _ := slices.BinarySearchFunc(next.mappings, m.Start, func(e *Mapping, start uint64) int { return cmp.Compare(e.Start, start) })
		next.mappings = slices.Insert(next.mappings, i, m)
	}
	img.kernel.Store(next)
}

// NewProcesses returns a tracker; nothing is read until Run runs.
func NewProcesses(cfg ProcessConfig) *Processes {
	p := &Processes{
		cfg:     cfg,
		procFS:  cmp.Or(cfg.ProcFS, "/proc"),
		pinned:  map[uint32]bool{},
		images:  map[uint32]*image{},
		pending: map[uint32]bool{},
		files:   map[objfile.Key]*objfile.File{},
		failed:  map[objfile.Key]bool{},
		wake:    make(chan struct{}, 1),

		checking: map[uint32]bool{},
		refill:   time.Now(),
	}
	p.settled = sync.NewCond(&p.mu)
	if cfg.Contexts != nil {
		p.contexts = tracectx.NewReader()
	}
	if p.cfg.MaxProcesses <= 0 {
		p.cfg.MaxProcesses = DefaultMaxProcesses
	}
	if p.cfg.MaxPendingReads <= 0 {
		p.cfg.MaxPendingReads = DefaultMaxPendingReads
	}
	if p.cfg.ExecReadsPerSecond == 0 {
		p.cfg.ExecReadsPerSecond = DefaultExecReadsPerSecond
	}
	p.tokens = float64(max(p.cfg.ExecReadsPerSecond, 0))
	for _, pid := range cfg.Pinned {
		p.pinned[pid] = true
	}
	var root objfile.Key
	if statKey("/proc/self/root", &root) == nil {
		p.rootDev = root
	}
	return p
}

// Run reads /proc for the processes that need it until ctx ends.
func (p *Processes) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.settled.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	for {
		p.mu.Lock()
		if len(p.queue) == 0 && len(p.checks) > 0 {
			pid := p.checks[0]
			p.checks = p.checks[1:]
			delete(p.checking, pid)
			img := p.images[pid]
			p.mu.Unlock()
			if img != nil {
				p.checkContext(img)
			}
			continue
		}
		if len(p.queue) == 0 {
			p.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil
			case <-p.wake:
			}
			continue
		}
		pid := p.queue[0]
		p.queue = p.queue[1:]
		delete(p.pending, pid)
		img := p.images[pid]
		p.mu.Unlock()
		if img != nil {
			p.read(img)
		}
		p.mu.Lock()
		p.done++
		p.settled.Broadcast()
		p.mu.Unlock()
	}
}

// Settle waits until the reads requested before the call are done, or ctx ends.
func (p *Processes) Settle(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.settled.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	target := p.queued
	for p.done < target && ctx.Err() == nil {
		p.settled.Wait()
	}
}

// enqueue asks Run to read pid. Caller holds mu.
func (p *Processes) enqueue(img *image) {
	if p.pending[img.pid] {
		return
	}
	if len(p.queue) >= p.cfg.MaxPendingReads {
		p.stats.ReadsDropped++
		img.requested.Store(false)
		return
	}
	img.requested.Store(true)
	p.pending[img.pid] = true
	p.queue = append(p.queue, img.pid)
	p.queued++
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// current returns the image pid runs now, execID being the exec a sample says it is at
// (0: unknown), starting to track the process if it is new. Called on the sample path:
// it never reads /proc, it asks Run to. It returns nil for a process beyond MaxProcesses.
func (p *Processes) current(pid uint32, execID uint64, comm string) *image {
	p.mu.Lock()
	defer p.mu.Unlock()
	img := p.images[pid]
	// An image that exited still takes the samples queued behind its exit event.
	if img != nil {
		switch have := img.execID.Load(); {
		case have == execID || execID == 0:
			p.readUnread(img)
			return img
		case have == 0 && !img.exited.Load():
			// Primed before its first sample: now the exec is known.
			img.execID.Store(execID)
			return img
		}
	}
	return p.start(pid, execID, comm, true)
}

// readUnread asks for the first reading of an image its exec left unread (the exec rate
// limit, or the grace), at its first sample. Caller holds mu.
func (p *Processes) readUnread(img *image) {
	if img.maps.Load() == nil && !img.requested.Load() && !img.exited.Load() {
		p.enqueue(img)
	}
}

// start begins tracking a new image of pid. read asks for its mappings at once. Caller
// holds mu.
func (p *Processes) start(pid uint32, execID uint64, comm string, read bool) *image {
	if _, tracked := p.images[pid]; !tracked && len(p.images) >= p.cfg.MaxProcesses {
		p.stats.Untracked++
		return nil
	}
	if old := p.images[pid]; old != nil {
		// Replaced by an exec: nothing is resolved against it or interned in its space again.
		old.forgotten.Store(true)
		p.replaced = append(p.replaced, old.space.Load())
	}
	now := time.Now()
	img := &image{pid: pid, comm: comm, createdAt: now, rereads: rereadBurst, rereadAt: now}
	img.space.Store(p.spaces.Add(1))
	img.execID.Store(execID)
	p.images[pid] = img
	if read {
		p.enqueue(img)
	}
	return img
}

// Exec starts a new image of pid at the exec execID. Its mappings are read at once, while
// the program still runs, within the exec rate limit; else when it is first sampled.
func (p *Processes) Exec(pid uint32, execID uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if img := p.images[pid]; img != nil && img.execID.Load() == execID && execID != 0 && !img.exited.Load() {
		return // a sample of the new image came first
	}
	now := time.Now()
	if rate := float64(p.cfg.ExecReadsPerSecond); rate > 0 {
		p.tokens = min(rate, p.tokens+now.Sub(p.refill).Seconds()*rate)
	}
	p.refill = now
	eager := p.tokens >= 1 || p.pinned[pid]
	switch {
	case p.pinned[pid]:
	case eager:
		p.tokens--
	default:
		p.stats.ExecReadsSkipped++
	}
	if p.cfg.ExecGrace > 0 && eager && !p.pinned[pid] {
		p.tokens++ // taken when the grace ends, if the process is still there
		if img := p.start(pid, execID, "", false); img != nil {
			p.graced = append(p.graced, gracedImage{img: img, until: now.Add(p.cfg.ExecGrace)})
			if !p.graceArmed {
				p.graceArmed = true
				time.AfterFunc(p.cfg.ExecGrace, p.endGraces)
			}
		}
		return
	}
	if img := p.start(pid, execID, "", eager); img != nil && eager {
		img.followUps = len(execFollowUps)
	}
}

type gracedImage struct {
	img   *image
	until time.Time
}

// endGraces ends the graces that are over, and arms the timer for the next if any.
func (p *Processes) endGraces() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	n := 0
	for n < len(p.graced) && !p.graced[n].until.After(now) {
		p.afterGrace(p.graced[n].img)
		n++
	}
	p.graced = slices.Delete(p.graced, 0, n)
	if len(p.graced) == 0 {
		p.graceArmed = false
		p.graced = nil // a storm's backing array goes with it
		return
	}
	time.AfterFunc(p.graced[0].until.Sub(now), p.endGraces)
}

// afterGrace reads an image whose exec's grace ended, unless the process exited, exec'd
// again or was read at a sample meanwhile. Caller holds mu.
func (p *Processes) afterGrace(img *image) {
	if p.images[img.pid] != img || img.exited.Load() || img.maps.Load() != nil || img.requested.Load() {
		p.stats.ExecGraceSkipped++
		return
	}
	if _, err := os.Stat(filepath.Join(p.procFS, strconv.FormatUint(uint64(img.pid), 10))); err != nil {
		p.stats.ExecGraceSkipped++ // exited, its exit event not here yet
		return
	}
	if p.tokens < 1 {
		p.stats.ExecReadsSkipped++
		return
	}
	p.tokens--
	// No follow-ups: past the grace, the loader has mapped what it maps.
	p.enqueue(img)
}

// execFollowUps are when an image read at its exec is read again while the reading shows
// only the program and its dynamic loader: at the exec, the loader has not mapped the
// program's libraries yet, and a program that lives a few milliseconds is gone before its
// samples would ask for another reading. Static programs, and dynamic ones whose libraries
// are in, are not read again.
var execFollowUps = [...]time.Duration{150 * time.Microsecond, 500 * time.Microsecond, 2 * time.Millisecond, 10 * time.Millisecond}

// followUp schedules the image's next read after its exec, if its latest reading lacks
// its libraries and the exec rate limit allows another read (targets named in advance do
// not count against it).
func (p *Processes) followUp(img *image, snap *snapshot) {
	if img.followUps == 0 || !loaderOnly(snap) {
		img.followUps = 0
		return
	}
	delay := execFollowUps[len(execFollowUps)-img.followUps]
	img.followUps--
	time.AfterFunc(delay, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.images[img.pid] != img || img.exited.Load() {
			return
		}
		if !p.pinned[img.pid] {
			if p.tokens < 1 {
				return
			}
			p.tokens--
		}
		p.enqueue(img)
	})
}

// loaderOnly reports whether a reading maps no more files executable than a program and
// its dynamic loader: what a dynamic program looks like before the loader mapped its
// libraries.
func loaderOnly(s *snapshot) bool {
	files := 0
	for _, m := range s.mappings {
		if m.File != nil {
			files++
		}
	}
	return files <= 2
}

// Exit marks pid's image for removal at the next sweep: samples taken just before the
// exit may still be in the ring buffer behind the event.
func (p *Processes) Exit(pid uint32) {
	p.mu.Lock()
	img := p.images[pid]
	p.mu.Unlock()
	if img != nil {
		img.exited.Store(true)
	}
}

// Prime reads a process's mappings before its first sample, so that the first samples
// of a process named in advance are unwound with its tables.
func (p *Processes) Prime(pid uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.images[pid] == nil {
		p.start(pid, 0, "", true)
	}
}

// reread asks for a new reading of an image whose samples hold addresses its mappings
// lack, within the image's rate limit.
func (p *Processes) reread(img *image) {
	if img.requested.Load() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.images[img.pid] != img {
		return
	}
	now := time.Now()
	img.rereads = min(rereadBurst, img.rereads+now.Sub(img.rereadAt).Seconds()*rereadRate)
	img.rereadAt = now
	if img.rereads < 1 {
		return
	}
	img.rereads--
	p.enqueue(img)
}

// read reads an image's process and mappings and publishes them.
func (p *Processes) read(img *image) {
	defer img.requested.Store(false)
	dir := filepath.Join(p.procFS, strconv.FormatUint(uint64(img.pid), 10))
	if img.proc.Load() == nil {
		img.proc.Store(p.readProcess(dir, img))
	}
	lines, ctxAddr, err := readMapsFile(filepath.Join(dir, "maps"))
	p.mu.Lock()
	p.stats.MapsReads++
	if err != nil {
		p.stats.MapsErrors++
	}
	p.mu.Unlock()
	if err != nil {
		return
	}
	if !p.stillAt(img) {
		p.mu.Lock()
		p.stats.MapsStale++
		p.mu.Unlock()
		return
	}
	prev := img.maps.Load()
	snap := &snapshot{mappings: make([]*Mapping, 0, len(lines)), prev: prev}
	hostRoot := p.sharesRoot(dir)
	for _, l := range lines {
		m := &Mapping{Start: l.Start, End: l.End, Offset: l.Offset, Path: strings.ToValidUTF8(l.Path, "\uFFFD")}
		if l.Inode != 0 && strings.HasPrefix(l.Path, "/") {
			m.File = p.file(dir, l, hostRoot)
		}
		if old := prev.same(m); old != nil {
			m = old // unchanged since the last reading: locations keep sharing it
		}
		snap.mappings = append(snap.mappings, m)
	}
	img.maps.Store(snap)
	if p.cfg.Observer != nil {
		p.cfg.Observer.ProcessMappings(img.pid, img.execID.Load(), snap.mappings)
	}
	p.readContext(img, snap, ctxAddr)
	p.mu.Lock()
	p.followUp(img, snap)
	p.mu.Unlock()
}

// same returns the mapping of the reading s equal to m, if any.
func (s *snapshot) same(m *Mapping) *Mapping {
	if s == nil {
		return nil
	}
	old := s.find(m.Start)
	if old == nil || old.Start != m.Start || old.End != m.End || old.Offset != m.Offset || old.Path != m.Path {
		return nil
	}
	if (old.File == nil) != (m.File == nil) || (old.File != nil && old.File != m.File) {
		return nil
	}
	return old
}

// stillAt reports whether the process is still at the image's exec after its maps were
// read: if it exec'd again meanwhile, the reading describes another program.
func (p *Processes) stillAt(img *image) bool {
	if p.cfg.ExecIDs == nil {
		return true
	}
	id, ok, err := p.cfg.ExecIDs.ExecID(img.pid)
	if err != nil || !ok {
		// No exec since sonde started (or the process exited): nothing replaced the image.
		return true
	}
	want := img.execID.Load()
	return want == 0 || id == want
}

// readProcess reads what describes the process: its name, executable and container.
func (p *Processes) readProcess(dir string, img *image) *Process {
	proc := &Process{PID: img.pid, Name: img.comm}
	if b, err := readSmallFile(filepath.Join(dir, "comm"), 64); err == nil {
		proc.Name = strings.ToValidUTF8(strings.TrimSuffix(string(b), "\n"), "\uFFFD")
	}
	if exe, err := os.Readlink(filepath.Join(dir, "exe")); err == nil {
		proc.ExePath = strings.ToValidUTF8(strings.TrimSuffix(exe, " (deleted)"), "\uFFFD")
	}
	if b, err := readSmallFile(filepath.Join(dir, "cgroup"), cgroup.MaxInput); err == nil {
		if info, err := cgroup.Parse(b); err == nil {
			proc.ContainerID, proc.PodUID, proc.Cgroup = info.ContainerID, info.PodUID, strings.ToValidUTF8(info.Path, "\uFFFD")
		}
	}
	if b, err := readSmallFile(filepath.Join(dir, "environ"), maxEnviron); err == nil {
		proc.EnvServiceName = strings.ToValidUTF8(envServiceName(b), "\uFFFD")
	}
	if p.cfg.Describer != nil {
		img.described.Store(p.cfg.Describer.Describe(proc))
	}
	return proc
}

// maxEnviron bounds what is read of a process's environment: the variables the
// OpenTelemetry SDK reads are usually set by whoever starts the process, near the start.
const maxEnviron = 256 << 10

// envServiceName finds the service name an OpenTelemetry SDK in the process would use,
// from its environment: OTEL_SERVICE_NAME, else service.name in OTEL_RESOURCE_ATTRIBUTES.
func envServiceName(environ []byte) string {
	var fromAttrs string
	for _, kv := range bytes.Split(environ, []byte{0}) {
		k, v, ok := bytes.Cut(kv, []byte{'='})
		if !ok {
			continue
		}
		switch string(k) {
		case "OTEL_SERVICE_NAME":
			if s := strings.TrimSpace(string(v)); s != "" {
				return s
			}
		case "OTEL_RESOURCE_ATTRIBUTES":
			for _, pair := range strings.Split(string(v), ",") {
				if name, value, ok := strings.Cut(pair, "="); ok && strings.TrimSpace(name) == "service.name" {
					if u, err := url.PathUnescape(strings.TrimSpace(value)); err == nil {
						fromAttrs = u
					}
				}
			}
		}
	}
	return fromAttrs
}

// sharesRoot reports whether the process at dir has sonde's own root directory.
func (p *Processes) sharesRoot(dir string) bool {
	var k objfile.Key
	return p.rootDev != (objfile.Key{}) && statKey(filepath.Join(dir, "root"), &k) == nil && k == p.rootDev
}

// file returns the shared description of a mapped file, identifying it on first sight.
func (p *Processes) file(dir string, l mapsLine, hostRoot bool) *objfile.File {
	key := objfile.Key{Dev: l.Dev, Inode: l.Inode}
	src := objfile.Source{ProcDir: dir, Start: l.Start, End: l.End, Path: strings.TrimSuffix(l.Path, " (deleted)"), HostRoot: hostRoot && !strings.HasSuffix(l.Path, " (deleted)")}
	p.mu.Lock()
	f, ok := p.files[key]
	p.mu.Unlock()
	if ok {
		f.AddSource(src)
		return f
	}
	f = objfile.NewFile(key, src.Path, src)
	err := objfile.Identify(f)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil && !p.failed[key] {
		p.failed[key] = true
		p.stats.FileErrors++
		p.countRefusal(err)
		if p.cfg.OnFileError != nil {
			p.cfg.OnFileError(src.Path, err)
		}
	}
	if have, ok := p.files[key]; ok {
		return have
	}
	p.files[key] = f
	return f
}

// sweep forgets processes: those that exited, and those not sampled for IdleFor before
// the interval began (seen lists the ones sampled in it) unless pinned or new. Files no
// remaining process maps go too, so memory follows what is running now rather than
// everything ever seen.
//
// It returns the interning spaces of the images it forgot, and of those execs replaced
// since the last sweep: no sample can name them again.
func (p *Processes) sweep(seen map[*image]bool, intervalStart time.Time) (spaces map[uint64]bool) {
	var gone, published []uint32
	p.mu.Lock()
	horizon := intervalStart.Add(-p.cfg.IdleFor)
	if len(p.images) >= p.cfg.MaxProcesses*3/4 {
		// Near the bound, the idle make room for processes not tracked yet.
		horizon = intervalStart
	}
	for pid, img := range p.images {
		if seen[img] {
			img.sampledIn = intervalStart
		}
		last := img.sampledIn
		if last.IsZero() {
			last = img.createdAt
		}
		idle := !seen[img] && !p.pinned[pid] && last.Before(horizon)
		if img.exited.Load() || idle {
			img.forgotten.Store(true)
			delete(p.images, pid)
			gone = append(gone, pid)
			// Only a process whose trace context the kernel was told of has an entry to
			// take back: under an exec storm, most that go never had one, and a delete
			// of nothing is still a system call.
			if st := img.ctx.Load(); st != nil && st.Kernel.Published() {
				published = append(published, pid)
			}
			if spaces == nil {
				spaces = map[uint64]bool{}
			}
			spaces[img.space.Load()] = true
		}
	}
	for _, space := range p.replaced {
		if spaces == nil {
			spaces = map[uint64]bool{}
		}
		spaces[space] = true
	}
	p.replaced = p.replaced[:0]
	live := make(map[objfile.Key]*objfile.File, len(p.files))
	for _, img := range p.images {
		if s := img.maps.Load(); s != nil {
			for _, m := range s.mappings {
				if m.File != nil {
					live[m.File.Key] = m.File
				}
			}
		}
	}
	p.files = live
	var redescribe []*image
	if p.cfg.Describer != nil {
		for _, img := range p.images {
			if proc := img.proc.Load(); proc != nil && !img.described.Load() {
				redescribe = append(redescribe, img)
			}
		}
	}
	// Failures are remembered longer than files so a broken file is reported once, not
	// once per interval; the bound keeps a host full of broken files from growing it forever.
	if len(p.failed) > maxRememberedFailures {
		clear(p.failed)
	}
	p.mu.Unlock()
	if p.cfg.Observer != nil {
		for _, pid := range gone {
			p.cfg.Observer.ProcessGone(pid)
		}
	}
	if p.cfg.Contexts != nil {
		for _, pid := range published {
			p.cfg.Contexts.TraceContextGone(pid)
		}
		p.scheduleContextChecks()
	}
	// What a Describer could not say at first (a pod the watch had not delivered yet)
	// it may say now; samples pick the new description up through the image.
	for _, img := range redescribe {
		next := *img.proc.Load()
		next.Attributes = maps.Clone(next.Attributes)
		img.described.Store(p.cfg.Describer.Describe(&next))
		img.proc.Store(&next)
	}
	return spaces
}

const maxRememberedFailures = 4096

// countRefusal counts why a file was refused, when it was. Caller holds mu.
func (p *Processes) countRefusal(err error) {
	switch {
	case errors.Is(err, objfile.ErrNotRegular):
		p.stats.FilesNotRegular++
	case errors.Is(err, objfile.ErrReplaced):
		p.stats.FilesReplaced++
	case errors.Is(err, objfile.ErrTooLarge):
		p.stats.FilesTooLarge++
	case errors.Is(err, objfile.ErrFUSE):
		p.stats.FilesFUSE++
	case errors.Is(err, objfile.ErrStalled):
		p.stats.FilesStalled++
	}
}

// Stats returns the counts so far.
func (p *Processes) Stats() ProcessStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	st.Processes, st.Files, st.Pending = len(p.images), len(p.files), len(p.queue)
	return st
}

// readSmallFile reads at most limit bytes of a /proc file.
func readSmallFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, limit)); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return buf.Bytes(), nil
}

func (s ProcessStats) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int("tracked", s.Processes), slog.Int("files", s.Files), slog.Uint64("maps_reads", s.MapsReads),
		slog.Uint64("maps_errors", s.MapsErrors), slog.Uint64("maps_stale", s.MapsStale), slog.Uint64("files_unidentified", s.FileErrors),
		slog.Uint64("files_not_regular", s.FilesNotRegular), slog.Uint64("files_replaced", s.FilesReplaced), slog.Uint64("files_too_large", s.FilesTooLarge),
		slog.Uint64("files_fuse", s.FilesFUSE), slog.Uint64("files_stalled", s.FilesStalled),
		slog.Uint64("reads_dropped", s.ReadsDropped), slog.Uint64("exec_reads_skipped", s.ExecReadsSkipped), slog.Uint64("exec_grace_skipped", s.ExecGraceSkipped), slog.Uint64("untracked_samples", s.Untracked),
		slog.Uint64("kernel_mappings", s.KernelMappings), slog.Uint64("kernel_mappings_unknown", s.KernelMappingsUnknown),
		slog.Uint64("tls_modules", s.Contexts.TLSModules), slog.Uint64("go_programs", s.Contexts.GoPrograms),
		slog.Uint64("process_contexts", s.Contexts.Contexts), slog.Uint64("process_context_errors", s.Contexts.ContextErrors))
}

// Process returns what was read of pid's current image, or nil.
func (p *Processes) Process(pid uint32) *Process {
	p.mu.Lock()
	img := p.images[pid]
	p.mu.Unlock()
	if img == nil {
		return nil
	}
	return img.proc.Load()
}
