package jvm

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sonde-profiler/sonde/internal/lru"
	"github.com/sonde-profiler/sonde/internal/readqueue"
	"github.com/sonde-profiler/sonde/trace"
)

// namesConfig configures the naming of the kernel's frames across processes.
type namesConfig struct {
	// MaxCodes bounds the frames' codes kept, named or not; 0 means DefaultMaxCodes.
	MaxCodes int
	// MaxBytes bounds, roughly, the bytes of what is kept; 0 means half of
	// DefaultRuntimeBytes.
	MaxBytes int
	// MaxPending bounds the codes waiting to be read; 0 means DefaultMaxPending.
	MaxPending int
	// Recheck is how long what was read is trusted before it is read again when next
	// seen; 0 means DefaultRecheck.
	Recheck time.Duration
	// OnReuse hears that code read for a process's image is another now (a method
	// freed and its address given to another, code compiled again at a pc): the
	// aggregator's RenewImage, so that new locations are made for what runs there now.
	OnReuse func(pid uint32, image uint64)
	now     func() time.Time
}

// Defaults of Config.
const (
	DefaultMaxCodes   = 1 << 16
	DefaultMaxPending = 4096
	DefaultRecheck    = 5 * time.Second
)

// NamesStats counts the naming of the kernel's frames.
type NamesStats struct {
	Read       uint64 // codes read from processes
	ReadErrors uint64 // reads that named nothing: the process gone, a pc in no code, not a Method
	Dropped    uint64 // codes not read early for a full queue
	Named      uint64 // locations named by methods
	Stubs      uint64 // locations in code the JVM generated: [jit] <blob name>
	Recompiled uint64 // locations whose nmethod was compiled again since: [jit] <blob name>
	Unnamed    uint64 // locations that could not be named: [jit] …
	Rechecks   uint64
	Reused     uint64 // codes found to be others than those named
	Cached     int
	CachedSize int
}

func (s NamesStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Uint64("read", s.Read), slog.Uint64("read_errors", s.ReadErrors),
		slog.Uint64("dropped", s.Dropped), slog.Uint64("named", s.Named), slog.Uint64("stubs", s.Stubs),
		slog.Uint64("recompiled", s.Recompiled), slog.Uint64("unnamed", s.Unnamed), slog.Uint64("rechecks", s.Rechecks),
		slog.Uint64("reused", s.Reused), slog.Int("cached", s.Cached), slog.Int("cached_bytes", s.CachedSize))
}

// outcome is how a code was named.
type outcome uint8

const (
	outNamed      outcome = iota // by its methods
	outStub                      // code the JVM generated, by its blob
	outRecompiled                // another compilation at the pc, by its blob
	outUnnamed                   // not read: [jit] …
)

// codeKey is a frame's code in one image: an address means something in one exec only.
type codeKey struct{ image, code uint64 }

// named is what was read for a frame's code: the lines of a pc (its methods, or its
// blob), or the method of an interpreted frame, whose line depends on the frame's bci.
type named struct {
	lines   []trace.Line
	mi      *MethodInfo
	outcome outcome
	checked time.Time
}

func (e *named) size() int {
	n := entryOverhead
	for _, l := range e.lines {
		n += 64 + len(l.Function) + len(l.SystemName) + len(l.File)
	}
	if mi := e.mi; mi != nil {
		n += methodSize(mi)
	}
	return n
}

// same says whether two reads of a code found the same.
func (e *named) same(o *named) bool {
	if e.outcome != o.outcome || !slices.Equal(e.lines, o.lines) || (e.mi == nil) != (o.mi == nil) {
		return false
	}
	if e.mi == nil {
		return true
	}
	a, b := e.mi, o.mi
	return a.Class == b.Class && a.Name == b.Name && a.Signature == b.Signature && a.File == b.File &&
		a.CodeSize == b.CodeSize && slices.Equal(a.Lines, b.Lines)
}

type pendingCode struct {
	pid   uint32
	check *named // a recheck of this entry; nil: a first read
}

// names names the kernel's JVM frames: it reads the code a stack shows as soon as the
// stack is first seen in an interval (SeenCode), through the process's Namer, on its own
// goroutine (Run), so that the process is most likely still there; Name takes what was
// read, reading what was missed then.
type names struct {
	cfg     namesConfig
	tracker *Tracker
	mu      sync.Mutex
	codes   *lru.LRU[codeKey, *named]
	bytes   int // of what codes holds, kept by its eviction callback under mu
	queue   *readqueue.Queue[codeKey, pendingCode]
	stats   NamesStats
}

func newNames(cfg namesConfig, t *Tracker) *names {
	if cfg.MaxCodes <= 0 {
		cfg.MaxCodes = DefaultMaxCodes
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultRuntimeBytes / 2
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.Recheck <= 0 {
		cfg.Recheck = DefaultRecheck
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	n := &names{cfg: cfg, tracker: t, codes: lru.New[codeKey, *named](cfg.MaxCodes),
		queue: readqueue.New[codeKey, pendingCode](cfg.MaxPending)}
	n.codes.SetOnEvict(func(_ codeKey, e *named) { n.bytes -= e.size() })
	return n
}

// add keeps what was read for k within the bounds; n.mu is held.
func (n *names) add(k codeKey, e *named) {
	n.codes.Remove(k)
	n.codes.Add(k, e)
	n.bytes += e.size()
	for n.bytes > n.cfg.MaxBytes {
		if _, _, ok := n.codes.RemoveOldest(); !ok {
			break
		}
	}
}

// SeenCode queues code to be read, unless known or queued; what was read long enough
// ago is queued to be read again, to find whether it is still what runs there.
func (n *names) SeenCode(pid uint32, image, code uint64) {
	// The frame is of the exec the kernel was told of: its image is the exec's.
	if n.tracker.namer(pid, image, true) == nil {
		return
	}
	k := codeKey{image: image, code: code}
	if n.queue.Queued(k) {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var check *named
	if e, ok := n.codes.Peek(k); ok {
		if n.cfg.now().Sub(e.checked) < n.cfg.Recheck {
			return
		}
		check = e
	}
	if !n.queue.Push(k, pendingCode{pid: pid, check: check}) {
		n.stats.Dropped++
	}
}

// Run reads what SeenCode queued until ctx ends.
func (n *names) Run(ctx context.Context) error {
	return n.queue.Run(ctx, func(k codeKey, p pendingCode) {
		e, gone := n.read(p.pid, k, true)
		n.mu.Lock()
		switch {
		case p.check == nil:
			n.add(k, e)
		case gone:
			// Nothing to compare with: what was named stays.
		default:
			n.stats.Rechecks++
			if e.same(p.check) {
				p.check.checked = e.checked
				break
			}
			n.stats.Reused++
			n.codes.Remove(k)
			n.mu.Unlock()
			if n.cfg.OnReuse != nil {
				n.cfg.OnReuse(p.pid, k.image)
			}
			return
		}
		n.mu.Unlock()
	})
}

// read reads a frame's code through the process's Namer; gone says the process (this
// exec of it) is no longer there to read.
func (n *names) read(pid uint32, k codeKey, bind bool) (e *named, gone bool) {
	e = &named{checked: n.cfg.now(), outcome: outUnnamed}
	pn := n.tracker.namer(pid, k.image, bind)
	pc, ret, tag, isCode := codeFrame(k.code)
	if pn == nil {
		e.lines = []trace.Line{unnamedLine(isCode)}
		n.count(func(s *NamesStats) { s.ReadErrors++ })
		return e, true
	}
	var err error
	if isCode {
		var frames []Frame
		frames, err = pn.CompiledAt(pc, ret, int(tag))
		e.lines = make([]trace.Line, len(frames))
		for i, f := range frames {
			e.lines[i] = lineOf(f)
		}
		switch {
		case errors.Is(err, ErrRecompiled):
			e.outcome = outRecompiled
		case err != nil:
		case len(frames) > 0 && frames[0].Method == 0:
			e.outcome = outStub
		default:
			e.outcome = outNamed
		}
		if len(e.lines) == 0 {
			e.lines, e.outcome = []trace.Line{unnamedLine(true)}, outUnnamed
		}
	} else {
		e.mi, err = pn.interpretedMethod(k.code)
		if err != nil {
			e.mi, e.lines = nil, []trace.Line{unnamedLine(false)}
		} else {
			e.outcome = outNamed
		}
	}
	n.count(func(s *NamesStats) {
		s.Read++
		if err != nil && e.outcome != outRecompiled {
			s.ReadErrors++
		}
	})
	return e, false
}

// unnamedLine is a frame whose code could not be read.
func unnamedLine(code bool) trace.Line {
	f := unnamed("interpreter")
	if code {
		f = unnamed("")
	}
	return lineOf(f)
}

// lineOf is a frame as a location's line: the method qualified by its class, and with
// its signature as the JVM names it, so that overloads stay apart.
func lineOf(f Frame) trace.Line {
	fn := strings.ToValidUTF8(f.Function, "\uFFFD") // a blob's name is the process's bytes
	l := trace.Line{Function: fn, SystemName: fn, File: f.File}
	if f.Signature != "" {
		l.SystemName = fn + f.Signature
	}
	if f.Line > 0 {
		l.Line = int64(f.Line)
	}
	return l
}

// Name returns the lines of a JVM location: a pc's methods, innermost first, or its
// code blob ([jit] <blob name>); an interpreted frame's method at its bci's line. What
// cannot be named is a [jit] line, never a guessed method.
func (n *names) Name(loc *trace.Location) ([]trace.Line, bool) {
	f := loc.Interp
	if f == nil {
		return nil, false
	}
	k := codeKey{image: f.Image, code: f.Code}
	n.mu.Lock()
	e, ok := n.codes.Get(k)
	n.mu.Unlock()
	if !ok {
		e, _ = n.read(f.PID, k, false)
		n.mu.Lock()
		n.add(k, e)
		n.mu.Unlock()
	}
	lines := e.lines
	if e.mi != nil {
		bci := int32(-1)
		if f.Offset < BCIUnknown && f.Offset < uint32(e.mi.CodeSize) {
			bci = int32(f.Offset)
		}
		lines = []trace.Line{lineOf(frameOf(e.mi, bci))}
	}
	n.count(func(s *NamesStats) {
		switch e.outcome {
		case outNamed:
			s.Named++
		case outStub:
			s.Stubs++
		case outRecompiled:
			s.Recompiled++
		default:
			s.Unnamed++
		}
	})
	return slices.Clone(lines), true
}

func (n *names) count(f func(*NamesStats)) {
	n.mu.Lock()
	f(&n.stats)
	n.mu.Unlock()
}

// Stats returns the counts so far.
func (n *names) Stats() NamesStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.stats
	s.Cached, s.CachedSize = n.codes.Len(), n.bytes
	return s
}
