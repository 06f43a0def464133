package jvm

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/trace"
)

// TrackerConfig configures a Tracker.
type TrackerConfig struct {
	// Kernel is where the tracker writes what the kernel walker needs of each JVM: a
	// KernelState (an interp.KernelValuer), whose ExecID says which exec of pid it is for.
	Kernel interp.Kernel
	// OnError hears once per file why HotSpot in it cannot be walked: a libjvm.so
	// without the tables or fields sonde reads, or a JVM whose tables could not be read
	// after every attempt. A JVM read while it had not initialised yet is not an error.
	OnError func(path string, err error)
	// MaxFiles bounds the files whose verdict is remembered; 0 means DefaultMaxFiles.
	MaxFiles int
	// MaxProcesses bounds the JVMs tracked at once; 0 means DefaultMaxProcesses. One
	// beyond it is not told to the kernel: its frames stay native.
	MaxProcesses int
	// Namer configures each process's Namer.
	Namer NamerConfig
	// find reads HotSpot in the libjvm.so m maps; nil: a Finder's. Tests replace it.
	find func(pid uint32, m *trace.Mapping) (*Process, error)
	// retryAfter is how long after its n-th failed read (from 1) a JVM that had not
	// initialised is read again; nil: retryDelay. Tests replace it.
	retryAfter func(n int) time.Duration
}

// Defaults of TrackerConfig.
const (
	DefaultMaxProcesses = 256
	// maxAttempts bounds the reads of one exec's JVM that fail: a JVM maps more as it
	// starts, so that the process's mappings come again while it initialises; one still
	// unreadable after this many is given up on until its next exec.
	maxAttempts = 32
	// firstRetry and lastRetry bound the wait before a JVM that had not initialised is
	// read again without new mappings: a JVM maps its libraries and code cache before it
	// sets the code cache up, so that no mapping may come after the read that was too
	// early. The wait doubles from the first: the attempts last about 20 s in all, a
	// JVM starting on a busy host included.
	firstRetry = 50 * time.Millisecond
	lastRetry  = 800 * time.Millisecond
)

// retryDelay is the wait after the n-th failed read (from 1).
func retryDelay(n int) time.Duration {
	return firstRetry << min(max(n-1, 0), 4) // 50 ms, 100 ms … 800 ms
}

// TrackerStats counts what a Tracker did.
type TrackerStats struct {
	Processes    int    // JVMs tracked now, those given up on included
	Walked       int    // of which the kernel walks
	NotReady     uint64 // reads of a JVM that had not initialised yet, to be tried again
	ReadErrors   uint64 // reads that failed otherwise
	GaveUp       uint64 // execs whose JVM was not read after every attempt, or cannot be
	Untracked    uint64 // JVMs not tracked for MaxProcesses
	KernelErrors uint64 // writes to the kernel that failed
}

func (s TrackerStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Int("processes", s.Processes), slog.Int("walked", s.Walked),
		slog.Uint64("not_ready", s.NotReady), slog.Uint64("read_errors", s.ReadErrors), slog.Uint64("gave_up", s.GaveUp),
		slog.Uint64("untracked", s.Untracked), slog.Uint64("kernel_errors", s.KernelErrors))
}

// Tracker finds HotSpot among each process's mappings and tells the kernel how to walk
// its frames; it implements trace.MappingObserver. A process that maps no libjvm.so
// costs a look at its mappings' paths; a libjvm.so is inspected once, by identity,
// whatever processes map it, and each exec of a JVM has its tables read once, then its
// code cache's state again as its mappings change.
type Tracker struct {
	cfg    TrackerConfig
	finder *Finder
	// observe serialises ProcessMappings and ProcessGone, which may take a while (a
	// JVM's tables are read then) and change a process's entry in steps.
	observe sync.Mutex

	mu       sync.Mutex
	procs    map[uint32]*tracked
	bad      map[objfile.ID]bool // files whose HotSpot cannot be read
	reported map[objfile.ID]bool // files OnError heard of
	stats    TrackerStats
	released NamerStats // of the Namers of processes forgotten
}

// tracked is one exec of a process that maps libjvm.so.
type tracked struct {
	pid      uint32
	execID   uint64
	lib      objfile.ID
	path     string
	libs     []*trace.Mapping // its libjvm.so mappings, as last given
	retry    *time.Timer      // reads it again while it has not initialised
	proc     *Process         // nil until its tables are read
	namer    *Namer           // with proc; read by the names' goroutine, under Tracker.mu
	state    *KernelState     // as last told to the kernel; nil: not told
	told     bool             // the kernel was told: a Delete is owed
	attempts int              // failed reads
	gaveUp   bool
	// image is the first of the aggregator's images (interning spaces) its frames were
	// seen in; 0 until one was. Spaces are numbered in order: one below it is an
	// earlier exec's, whose code is not this JVM's to name.
	image uint64
}

// NewTracker returns a Tracker writing to cfg.Kernel.
func NewTracker(cfg TrackerConfig) *Tracker {
	if cfg.MaxFiles <= 0 {
		cfg.MaxFiles = DefaultMaxFiles
	}
	if cfg.MaxProcesses <= 0 {
		cfg.MaxProcesses = DefaultMaxProcesses
	}
	t := &Tracker{cfg: cfg, finder: NewFinder(cfg.MaxFiles), procs: map[uint32]*tracked{},
		bad: map[objfile.ID]bool{}, reported: map[objfile.ID]bool{}}
	if t.cfg.find == nil {
		t.cfg.find = t.finder.findIn
	}
	if t.cfg.retryAfter == nil {
		t.cfg.retryAfter = retryDelay
	}
	return t
}

// libJVMs returns the mappings of libjvm.so among a process's: the only files a JVM is
// looked for in.
func libJVMs(mappings []*trace.Mapping) []*trace.Mapping {
	var out []*trace.Mapping
	for _, m := range mappings {
		if m.File != nil && IsLibJVM(m.Path) {
			out = append(out, m)
		}
	}
	return out
}

// ProcessMappings looks for HotSpot among a process's mappings, reads the JVM's tables
// once per exec and, whenever its mappings change, its code cache's state, which the
// kernel is told when it changed. A JVM read before it initialised is read again, a
// bounded number of times: at its next mappings, or after a wait if none come first.
func (t *Tracker) ProcessMappings(pid uint32, execID uint64, mappings []*trace.Mapping) {
	t.observe.Lock()
	defer t.observe.Unlock()
	t.processMappings(pid, execID, libJVMs(mappings))
}

// retry reads a JVM that had not initialised again, if it is still the one tracked.
func (t *Tracker) retry(e *tracked) {
	t.observe.Lock()
	defer t.observe.Unlock()
	t.mu.Lock()
	current := t.procs[e.pid] == e
	t.mu.Unlock()
	if current && !e.gaveUp && e.state == nil {
		t.processMappings(e.pid, e.execID, e.libs)
	}
}

// processMappings is ProcessMappings for a process's libjvm.so mappings; t.observe is
// held.
func (t *Tracker) processMappings(pid uint32, execID uint64, libs []*trace.Mapping) {
	if len(libs) == 0 {
		t.forget(pid)
		return
	}
	id := libs[0].File.ID()
	t.mu.Lock()
	e := t.procs[pid]
	t.mu.Unlock()
	if e != nil && (e.execID != execID || e.lib != id) {
		t.forget(pid) // another program now, or another JVM
		e = nil
	}
	if e == nil {
		t.mu.Lock()
		bad := t.bad[id]
		full := len(t.procs) >= t.cfg.MaxProcesses
		if !bad && full {
			t.stats.Untracked++
		}
		if !bad && !full {
			e = &tracked{pid: pid, execID: execID, lib: id, path: libs[0].Path}
			t.procs[pid] = e
			t.stats.Processes = len(t.procs)
		}
		t.mu.Unlock()
		if e == nil {
			return
		}
	}
	if e.gaveUp {
		return
	}
	e.libs = libs
	if e.proc == nil {
		p, err := t.find(pid, libs)
		if err != nil {
			if t.failed(e, err) {
				t.forget(pid) // nothing to keep of a file that cannot be read
			}
			return
		}
		// What is read is in the Layout: the tables it came from take a few hundred KB
		// a JVM.
		p.VM = nil
		n := NewNamer(p, t.cfg.Namer)
		t.mu.Lock()
		e.proc, e.namer = p, n
		t.mu.Unlock()
	}
	st, err := e.proc.KernelState()
	if err != nil {
		if e.state == nil {
			t.failed(e, err)
		} else {
			// Told once: the kernel walks by what it has.
			t.count(func(s *TrackerStats) { s.ReadErrors++ })
		}
		return
	}
	st.ExecID = execID
	if e.state != nil && e.state.equal(st) {
		return
	}
	e.told = true
	if err := t.cfg.Kernel.Set(pid, execID, st, nil); err != nil {
		t.count(func(s *TrackerStats) { s.KernelErrors++ })
		return
	}
	first := e.state == nil
	e.state = st
	if first {
		t.count(func(s *TrackerStats) { s.Walked++ })
	}
}

// find reads HotSpot in the first of a process's libjvm.so mappings it lies in.
func (t *Tracker) find(pid uint32, libs []*trace.Mapping) (*Process, error) {
	for _, m := range libs {
		p, err := t.cfg.find(pid, m)
		if p != nil || err != nil {
			return p, err
		}
	}
	return nil, fmt.Errorf("%s: no mapping of it at a segment of the file", libs[0].Path)
}

// failed counts a read of a JVM that failed and gives up on its exec when the failure is
// the file's (HotSpot sonde cannot read: it says so) or after maxAttempts; OnError hears
// of the file then, once, unless the JVM had only not initialised yet.
func (t *Tracker) failed(e *tracked, err error) (ofFile bool) {
	notReady := errors.Is(err, ErrNotReady)
	var fe *fileError
	ofFile = errors.As(err, &fe) || errors.Is(err, ErrMissing)
	e.attempts++
	t.mu.Lock()
	if notReady {
		t.stats.NotReady++
	} else {
		t.stats.ReadErrors++
	}
	if !ofFile && e.attempts < maxAttempts {
		t.mu.Unlock()
		if notReady {
			if e.retry != nil {
				e.retry.Stop()
			}
			e.retry = time.AfterFunc(t.cfg.retryAfter(e.attempts), func() { t.retry(e) })
		}
		return false
	}
	e.gaveUp = true
	t.stats.GaveUp++
	if ofFile {
		if len(t.bad) >= t.cfg.MaxFiles {
			clear(t.bad)
		}
		t.bad[e.lib] = true
	}
	// A libjvm.so without any of the tables is not HotSpot (OpenJ9 has one too): not
	// worth a word.
	quiet := notReady || (fe != nil && fe.err == ErrNotHotSpot)
	report := !quiet && !t.reported[e.lib] && t.cfg.OnError != nil
	if report {
		if len(t.reported) >= t.cfg.MaxFiles {
			clear(t.reported)
		}
		t.reported[e.lib] = true
	}
	t.mu.Unlock()
	if report {
		t.cfg.OnError(e.path, err)
	}
	return ofFile
}

// ProcessGone forgets a process.
func (t *Tracker) ProcessGone(pid uint32) {
	t.observe.Lock()
	defer t.observe.Unlock()
	t.forget(pid)
}

// forget drops a process's entry and its Namer's cache, and deletes it from the kernel
// if it was told. t.observe is held.
func (t *Tracker) forget(pid uint32) {
	t.mu.Lock()
	e := t.procs[pid]
	delete(t.procs, pid)
	t.stats.Processes = len(t.procs)
	if e != nil && e.state != nil {
		t.stats.Walked--
	}
	t.mu.Unlock()
	if e == nil {
		return
	}
	if e.retry != nil {
		e.retry.Stop()
	}
	if e.namer != nil {
		s := e.namer.Stats()
		e.namer.release()
		s.Entries, s.Bytes = 0, 0
		t.mu.Lock()
		t.released.add(s)
		t.mu.Unlock()
	}
	if e.told {
		if err := t.cfg.Kernel.Delete(pid); err != nil {
			t.count(func(s *TrackerStats) { s.KernelErrors++ })
		}
	}
}

// namer returns the Namer of the JVM a process runs now, for code seen in image; nil
// when the process is not a JVM sonde reads, or image is an earlier exec's. bind makes
// image the exec's first when it has none.
func (t *Tracker) namer(pid uint32, image uint64, bind bool) *Namer {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.procs[pid]
	if e == nil || e.namer == nil {
		return nil
	}
	if e.image == 0 {
		if !bind {
			// Named at a flush before any sample of this exec was seen: the location
			// may be the exec's before.
			return nil
		}
		e.image = image
	}
	if image < e.image {
		return nil
	}
	return e.namer
}

// Process returns the JVM a process runs, as read, or nil.
func (t *Tracker) Process(pid uint32) *Process {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.procs[pid]; e != nil {
		return e.proc
	}
	return nil
}

func (t *Tracker) count(f func(*TrackerStats)) {
	t.mu.Lock()
	f(&t.stats)
	t.mu.Unlock()
}

// Stats returns the counts so far.
func (t *Tracker) Stats() TrackerStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}

// FinderStats returns what the Tracker's Finder did.
func (t *Tracker) FinderStats() FinderStats { return t.finder.Stats() }

// NamerStats adds up what the Namers of the processes tracked did, and of those gone.
func (t *Tracker) NamerStats() NamerStats {
	t.mu.Lock()
	s := t.released
	namers := make([]*Namer, 0, len(t.procs))
	for _, e := range t.procs {
		if e.namer != nil {
			namers = append(namers, e.namer)
		}
	}
	t.mu.Unlock()
	for _, n := range namers {
		s.add(n.Stats())
	}
	return s
}
