package python

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/trace"
)

// NamerConfig configures a Namer.
type NamerConfig struct {
	// Images tells which interpreter a process runs: the Tracker.
	Images interface{ Image(pid uint32) *Image }
	// Memory opens a process's memory; nil means ProcessMemory.
	Memory func(pid uint32) Memory
	// MaxCodes bounds the code objects kept, named or failed; 0 means DefaultMaxCodes.
	MaxCodes int
	// MaxPending bounds the code objects waiting to be read; 0 means DefaultMaxPending.
	MaxPending int
	// Recheck is how long a code object is trusted before it is checked again, when next
	// seen, for another object at its address; 0 means DefaultRecheck.
	Recheck time.Duration
	// OnReuse hears that an image's interpreter gave a code object's address to another
	// code object: the aggregator's RenewImage, so that the old locations keep their name
	// and new ones are made for what runs now.
	OnReuse func(pid uint32, image uint64)
	// OnShim hears of a shim code object, which no one wrote (its first line is 0): the
	// Tracker's SkipCode, so that the kernel leaves its frames out.
	OnShim func(pid uint32, code uint64)
	// now is time.Now; tests replace it.
	now func() time.Time
}

// Defaults of NamerConfig.
const (
	DefaultMaxCodes   = 1 << 16
	DefaultMaxPending = 4096
	// DefaultRecheck: about once an interval, each code object still running is checked.
	DefaultRecheck = 5 * time.Second
)

// NamerStats counts what a Namer did.
type NamerStats struct {
	CodesRead   uint64 // code objects read from processes
	ReadErrors  uint64 // reads that failed: the process exited, or the object was not a code object
	Dropped     uint64 // code objects not read early for a full queue
	Named       uint64 // locations named
	Unnamed     uint64 // locations left unnamed
	UnnamedGone uint64 // of which the process had exited before its code object was read
	Rechecks    uint64 // code objects checked again for a reused address
	Reused      uint64 // addresses found holding another code object than the one named
	CachedCodes int
}

func (s NamerStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Uint64("codes_read", s.CodesRead), slog.Uint64("read_errors", s.ReadErrors),
		slog.Uint64("dropped", s.Dropped), slog.Uint64("named", s.Named), slog.Uint64("unnamed", s.Unnamed),
		slog.Uint64("unnamed_process_gone", s.UnnamedGone), slog.Uint64("rechecks", s.Rechecks), slog.Uint64("reused", s.Reused),
		slog.Int("cached_codes", s.CachedCodes))
}

// Namer names CPython frames. Code objects are read as soon as a stack holding them is
// first seen in an interval (SeenCode, a trace.InterpObserver), on the Namer's own
// goroutine, so that the process is most likely still there; naming at flush (Name) takes
// them from the cache, reading those it missed then.
type Namer struct {
	cfg   NamerConfig
	codes *interp.Codes[*Code] // nil: a code object that could not be read
	stats interp.Counts[NamerStats]
}

// retryFailed is how long after a failed read a code object is read again when next seen
// or named.
const retryFailed = 500 * time.Millisecond

// NewNamer returns a Namer; Run reads what SeenCode queues.
func NewNamer(cfg NamerConfig) *Namer {
	if cfg.Memory == nil {
		cfg.Memory = func(pid uint32) Memory { return ProcessMemory(pid) }
	}
	n := &Namer{cfg: cfg}
	n.codes = interp.NewCodes(interp.CodesConfig[*Code]{
		MaxCodes:    cmp.Or(max(cfg.MaxCodes, 0), DefaultMaxCodes),
		MaxPending:  cmp.Or(max(cfg.MaxPending, 0), DefaultMaxPending),
		Recheck:     cmp.Or(max(cfg.Recheck, 0), DefaultRecheck),
		Read:        func(pid uint32, k interp.CodeKey, _ bool) (*Code, bool) { return n.read(pid, k.Code), false },
		Recheckable: func(c *Code) bool { return c != nil },
		Failed:      func(c *Code) bool { return c == nil },
		Retry:       retryFailed,
		Same:        n.same,
		OnReuse:     cfg.OnReuse,
		Now:         cfg.now,
	})
	return n
}

// SeenCode queues a code object to be read, unless it is known or queued already; one
// read long enough ago is queued to be checked again.
func (n *Namer) SeenCode(pid uint32, image, code uint64) {
	n.codes.Seen(pid, interp.CodeKey{Image: image, Code: code})
}

// Run reads queued code objects until ctx ends.
func (n *Namer) Run(ctx context.Context) error { return n.codes.Run(ctx) }

// same checks that a code object is still the one named: if another took its address, the
// image is renewed and the new one named afresh.
func (n *Namer) same(pid uint32, k interp.CodeKey, old *Code) (same, decided bool) {
	img := n.cfg.Images.Image(pid)
	if img == nil {
		return false, false
	}
	print, err := img.readFingerprint(n.cfg.Memory(pid), k.Code)
	return err == nil && print == old.print, true
}

// read reads a code object of the process, or returns nil.
func (n *Namer) read(pid uint32, code uint64) *Code {
	img := n.cfg.Images.Image(pid)
	if img == nil {
		n.stats.Add(func(s *NamerStats) { s.ReadErrors++ })
		return nil
	}
	c, err := img.ReadCode(n.cfg.Memory(pid), code)
	n.stats.Add(func(s *NamerStats) {
		s.CodesRead++
		if err != nil {
			s.ReadErrors++
		}
	})
	if err != nil {
		return nil
	}
	if c.FirstLine == 0 && img.Version.AtLeast(12) && n.cfg.OnShim != nil {
		n.cfg.OnShim(pid, code)
	}
	return c
}

// Name returns the line of a CPython location: the code object's qualified name and
// file, and the line of its instruction. A code object not read yet is read now.
func (n *Namer) Name(loc *trace.Location) ([]trace.Line, bool) {
	f := loc.Interp
	if f == nil {
		return nil, false
	}
	c, known := n.codes.Get(f.PID, interp.CodeKey{Image: f.Image, Code: f.Code})
	if c == nil {
		n.stats.Add(func(s *NamerStats) {
			s.Unnamed++
			if !known && n.cfg.Images.Image(f.PID) == nil {
				s.UnnamedGone++
			}
		})
		return nil, false
	}
	n.stats.Add(func(s *NamerStats) { s.Named++ })
	return []trace.Line{{Function: c.Name, SystemName: c.Name, File: c.File, Line: int64(c.Line(int(f.Offset)))}}, true
}

// Stats returns the counts so far.
func (n *Namer) Stats() NamerStats {
	st := n.stats.Get()
	cs := n.codes.Stats()
	st.Dropped, st.Rechecks, st.Reused, st.CachedCodes = cs.Dropped, cs.Rechecks, cs.Reused, cs.Cached
	return st
}
