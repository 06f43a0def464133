package jvm

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/sonde-profiler/sonde/interp"
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

// named is what was read for a frame's code: the lines of a pc (its methods, or its
// blob), or the method of an interpreted frame, whose line depends on the frame's bci.
type named struct {
	lines   []trace.Line
	mi      *MethodInfo
	outcome outcome
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

// names names the kernel's JVM frames: it reads the code a stack shows as soon as the
// stack is first seen in an interval (SeenCode), through the process's Namer, on its own
// goroutine (Run), so that the process is most likely still there; Name takes what was
// read, reading what was missed then.
type names struct {
	cfg     namesConfig
	tracker *Tracker
	codes   *interp.Codes[*named]
	stats   interp.Counts[NamesStats]
}

func newNames(cfg namesConfig, t *Tracker) *names {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultRuntimeBytes / 2
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	n := &names{cfg: cfg, tracker: t}
	n.codes = interp.NewCodes(interp.CodesConfig[*named]{
		MaxCodes:   cmp.Or(max(cfg.MaxCodes, 0), DefaultMaxCodes),
		MaxPending: cmp.Or(max(cfg.MaxPending, 0), DefaultMaxPending),
		MaxBytes:   cfg.MaxBytes,
		Size:       (*named).size,
		Recheck:    cmp.Or(max(cfg.Recheck, 0), DefaultRecheck),
		Read:       n.read,
		// What was read is read again, to find whether it is still what runs there; a
		// process gone leaves nothing to compare with, and what was named stays.
		Same: func(pid uint32, k interp.CodeKey, old *named) (bool, bool) {
			e, gone := n.read(pid, k, true)
			return e.same(old), !gone
		},
		OnReuse: cfg.OnReuse,
		Now:     func() time.Time { return n.cfg.now() },
	})
	return n
}

// SeenCode queues code to be read, unless known or queued; what was read long enough
// ago is queued to be read again, to find whether it is still what runs there.
func (n *names) SeenCode(pid uint32, image, code uint64) {
	// The frame is of the exec the kernel was told of: its image is the exec's.
	if n.tracker.namer(pid, image, true) == nil {
		return
	}
	n.codes.Seen(pid, interp.CodeKey{Image: image, Code: code})
}

// Run reads what SeenCode queued until ctx ends.
func (n *names) Run(ctx context.Context) error { return n.codes.Run(ctx) }

// read reads a frame's code through the process's Namer; gone says the process (this
// exec of it) is no longer there to read.
func (n *names) read(pid uint32, k interp.CodeKey, bind bool) (e *named, gone bool) {
	e = &named{outcome: outUnnamed}
	pn := n.tracker.namer(pid, k.Image, bind)
	pc, ret, tag, isCode := codeFrame(k.Code)
	if pn == nil {
		e.lines = []trace.Line{unnamedLine(isCode)}
		n.stats.Add(func(s *NamesStats) { s.ReadErrors++ })
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
		e.mi, err = pn.interpretedMethod(k.Code)
		if err != nil {
			e.mi, e.lines = nil, []trace.Line{unnamedLine(false)}
		} else {
			e.outcome = outNamed
		}
	}
	n.stats.Add(func(s *NamesStats) {
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
	e, _ := n.codes.Get(f.PID, interp.CodeKey{Image: f.Image, Code: f.Code})
	lines := e.lines
	if e.mi != nil {
		bci := int32(-1)
		if f.Offset < BCIUnknown && f.Offset < uint32(e.mi.CodeSize) {
			bci = int32(f.Offset)
		}
		lines = []trace.Line{lineOf(frameOf(e.mi, bci))}
	}
	n.stats.Add(func(s *NamesStats) {
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

// Stats returns the counts so far.
func (n *names) Stats() NamesStats {
	s := n.stats.Get()
	cs := n.codes.Stats()
	s.Dropped, s.Rechecks, s.Reused, s.Cached, s.CachedSize = cs.Dropped, cs.Rechecks, cs.Reused, cs.Cached, cs.Bytes
	return s
}
