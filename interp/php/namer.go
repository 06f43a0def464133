package php

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
	// Images tells which engine a process runs: the Tracker.
	Images interface{ Image(pid uint32) *Image }
	// Memory opens a process's memory; nil means ProcessMemory.
	Memory func(pid uint32) Memory
	// MaxFunctions bounds the functions kept, named or failed; 0 means DefaultMaxFunctions.
	MaxFunctions int
	// MaxPending bounds the functions waiting to be read; 0 means DefaultMaxPending.
	MaxPending int
	// Recheck is how long a function is trusted before it is checked again, when next
	// seen, for another at its address; 0 means DefaultRecheck.
	Recheck time.Duration
	// OnReuse hears that an image's engine gave a function's address to another: the
	// aggregator's RenewImage, so that old locations keep their names.
	OnReuse func(pid uint32, image uint64)
	// now is time.Now; tests replace it.
	now func() time.Time
}

// Defaults of NamerConfig.
const (
	DefaultMaxFunctions = 1 << 16
	DefaultMaxPending   = 4096
	// DefaultRecheck: about once an interval, each function still running is checked; a
	// php-fpm worker without opcache compiles its scripts again for every request.
	DefaultRecheck = 5 * time.Second
)

// retryFailed is how long after a failed read a function is read again when next seen.
const retryFailed = 500 * time.Millisecond

// NamerStats counts what a Namer did.
type NamerStats struct {
	Read            uint64 // functions read from processes
	ReadErrors      uint64 // reads that failed: the process exited, or the address held no function
	Dropped         uint64 // functions not read early for a full queue
	Named           uint64 // locations named
	Unnamed         uint64 // locations left unnamed
	Rechecks        uint64 // functions checked again for a reused address
	Reused          uint64 // addresses found holding another function than the one named
	Retries         uint64 // failed reads tried again
	CachedFunctions int
}

func (s NamerStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Uint64("read", s.Read), slog.Uint64("read_errors", s.ReadErrors),
		slog.Uint64("dropped", s.Dropped), slog.Uint64("named", s.Named), slog.Uint64("unnamed", s.Unnamed),
		slog.Uint64("rechecks", s.Rechecks), slog.Uint64("reused", s.Reused), slog.Uint64("retries", s.Retries),
		slog.Int("cached", s.CachedFunctions))
}

// Namer names PHP frames. Functions are read as soon as a stack holding them is first seen
// in an interval (SeenCode), on the Namer's own goroutine, so that the process, and the
// request that compiled them, are most likely still there; naming at flush takes them from
// the cache, reading those it missed then.
type Namer struct {
	cfg   NamerConfig
	funcs *interp.Codes[*Function] // nil: a function that could not be read
	stats interp.Counts[NamerStats]
}

// NewNamer returns a Namer; Run reads what SeenCode queues.
func NewNamer(cfg NamerConfig) *Namer {
	if cfg.Memory == nil {
		cfg.Memory = func(pid uint32) Memory { return ProcessMemory(pid) }
	}
	n := &Namer{cfg: cfg}
	n.funcs = interp.NewCodes(interp.CodesConfig[*Function]{
		MaxCodes:    cmp.Or(max(cfg.MaxFunctions, 0), DefaultMaxFunctions),
		MaxPending:  cmp.Or(max(cfg.MaxPending, 0), DefaultMaxPending),
		Recheck:     cmp.Or(max(cfg.Recheck, 0), DefaultRecheck),
		Read:        func(pid uint32, k interp.CodeKey, _ bool) (*Function, bool) { return n.read(pid, k.Code) },
		Recheckable: func(f *Function) bool { return f != nil },
		Failed:      func(f *Function) bool { return f == nil },
		Retry:       retryFailed,
		Same:        n.same,
		OnReuse:     cfg.OnReuse,
		Now:         cfg.now,
	})
	return n
}

// SeenCode queues a function to be read, unless it is known or queued already.
func (n *Namer) SeenCode(pid uint32, image, function uint64) {
	n.funcs.Seen(pid, interp.CodeKey{Image: image, Code: function})
}

// Run reads queued functions until ctx ends.
func (n *Namer) Run(ctx context.Context) error { return n.funcs.Run(ctx) }

func (n *Namer) same(pid uint32, k interp.CodeKey, old *Function) (same, decided bool) {
	img := n.cfg.Images.Image(pid)
	if img == nil {
		return false, false
	}
	print, err := img.readFingerprint(n.cfg.Memory(pid), k.Code)
	return err == nil && print == old.print, true
}

// read reads a function of the process, or returns nil; gone says the process is.
func (n *Namer) read(pid uint32, addr uint64) (*Function, bool) {
	img := n.cfg.Images.Image(pid)
	if img == nil {
		n.stats.Add(func(s *NamerStats) { s.ReadErrors++ })
		return nil, true
	}
	f, err := img.ReadCode(n.cfg.Memory(pid), addr)
	n.stats.Add(func(s *NamerStats) {
		s.Read++
		if err != nil {
			s.ReadErrors++
		}
	})
	if err != nil {
		return nil, false
	}
	return f, false
}

// unnamed is the name of a PHP frame whose function could not be read.
const unnamed = "[php]"

// Name returns the line of a PHP location: the function's name, its file, and the line its
// frame ran.
func (n *Namer) Name(loc *trace.Location) ([]trace.Line, bool) {
	in := loc.Interp
	if in == nil {
		return nil, false
	}
	f, _ := n.funcs.Get(in.PID, interp.CodeKey{Image: in.Image, Code: in.Code})
	if f == nil {
		// A PHP frame all the same (the function could not be read: the process ended,
		// the request freed it): shown as [php], never as a raw value.
		n.stats.Add(func(s *NamerStats) { s.Unnamed++ })
		return []trace.Line{{Function: unnamed, SystemName: unnamed}}, true
	}
	n.stats.Add(func(s *NamerStats) { s.Named++ })
	return []trace.Line{{Function: f.Name, SystemName: f.Name, File: f.File, Line: int64(f.Line(in.Offset))}}, true
}

// Stats returns the counts so far.
func (n *Namer) Stats() NamerStats {
	st := n.stats.Get()
	cs := n.funcs.Stats()
	st.Dropped, st.Rechecks, st.Reused, st.Retries, st.CachedFunctions = cs.Dropped, cs.Rechecks, cs.Reused, cs.Retries, cs.Cached
	return st
}
