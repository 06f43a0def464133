package interp

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/sonde-profiler/sonde/internal/procmem"
	"github.com/sonde-profiler/sonde/trace"
)

// CodeNamerConfig configures a CodeNamer: how a runtime reads the code its frames name
// (E, a pointer: nil is code that could not be read) and names a frame of it.
type CodeNamerConfig[E comparable] struct {
	// Read reads the code at addr in pid; gone says pid's image is gone.
	Read func(pid uint32, addr uint64) (e E, gone bool, err error)
	// Print reads what tells the code at addr from other code at the same address, as
	// PrintOf told it of code read before; decided false: pid's image is gone.
	Print   func(pid uint32, addr uint64) (print [4]uint64, decided bool, err error)
	PrintOf func(e E) [4]uint64
	// Lines names a frame of e at offset.
	Lines func(e E, offset uint32) []trace.Line
	// Unnamed names a frame whose code could not be read ("[php]"): a frame of the
	// runtime all the same, never a raw value.
	Unnamed string
	// MaxCodes bounds the code kept, read or failed; MaxPending the code waiting to be
	// read. Recheck is how long code is trusted before it is checked again, when next
	// seen, for other code at its address; Retry how long after a failed read it is read
	// again. All must be positive.
	MaxCodes, MaxPending int
	Recheck, Retry       time.Duration
	// OnReuse hears that an image's runtime gave a code address to other code: the
	// aggregator's RenewImage.
	OnReuse func(pid uint32, image uint64)
	Now     func() time.Time
}

// CodeNamerStats counts what a CodeNamer did.
type CodeNamerStats struct {
	Read       uint64 // code read from processes
	ReadErrors uint64 // reads that failed: the process exited, or the address held no such code
	Dropped    uint64 // code not read early for a full queue
	Named      uint64 // locations named
	Unnamed    uint64 // locations left unnamed
	Rechecks   uint64 // code checked again for a reused address
	Reused     uint64 // addresses found holding other code than the one named
	Retries    uint64 // failed reads tried again
	Cached     int
}

func (s CodeNamerStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Uint64("read", s.Read), slog.Uint64("read_errors", s.ReadErrors),
		slog.Uint64("dropped", s.Dropped), slog.Uint64("named", s.Named), slog.Uint64("unnamed", s.Unnamed),
		slog.Uint64("rechecks", s.Rechecks), slog.Uint64("reused", s.Reused), slog.Uint64("retries", s.Retries),
		slog.Int("cached", s.Cached))
}

// CodeNamer names a runtime's frames from the code they run, read from the process as
// soon as a stack first shows it in an interval (SeenCode), on the namer's own goroutine,
// so that the process (and the request or GC cycle that may free the code) is most likely
// still there; naming at flush takes it from the cache (Codes), reading what was missed.
// PHP's and Ruby's namers are one.
type CodeNamer[E comparable] struct {
	cfg   CodeNamerConfig[E]
	codes *Codes[E]
	stats Counts[CodeNamerStats]
}

// NewCodeNamer returns a CodeNamer; Run reads what SeenCode queues.
func NewCodeNamer[E comparable](cfg CodeNamerConfig[E]) *CodeNamer[E] {
	n := &CodeNamer[E]{cfg: cfg}
	var none E
	n.codes = NewCodes(CodesConfig[E]{
		MaxCodes:    cfg.MaxCodes,
		MaxPending:  cfg.MaxPending,
		Recheck:     cfg.Recheck,
		Read:        func(pid uint32, k CodeKey, _ bool) (E, bool) { return n.read(pid, k.Code) },
		Recheckable: func(e E) bool { return e != none },
		Failed:      func(e E) bool { return e == none },
		Retry:       cfg.Retry,
		Same: func(pid uint32, k CodeKey, old E) (same, decided bool) {
			print, decided, err := cfg.Print(pid, k.Code)
			return decided && err == nil && print == cfg.PrintOf(old), decided
		},
		OnReuse: cfg.OnReuse,
		Now:     cfg.Now,
	})
	return n
}

func (n *CodeNamer[E]) read(pid uint32, addr uint64) (E, bool) {
	e, gone, err := n.cfg.Read(pid, addr)
	n.stats.Add(func(s *CodeNamerStats) {
		if !gone {
			s.Read++
		}
		if err != nil || gone {
			s.ReadErrors++
		}
	})
	if err != nil {
		var none E
		return none, gone
	}
	return e, gone
}

// SeenCode queues code to be read, unless it is known or queued already.
func (n *CodeNamer[E]) SeenCode(pid uint32, image, code uint64) {
	n.codes.Seen(pid, CodeKey{Image: image, Code: code})
}

// Run reads queued code until ctx ends.
func (n *CodeNamer[E]) Run(ctx context.Context) error { return n.codes.Run(ctx) }

// Name returns the lines of a location of the runtime.
func (n *CodeNamer[E]) Name(loc *trace.Location) ([]trace.Line, bool) {
	in := loc.Interp
	if in == nil {
		return nil, false
	}
	e, _ := n.codes.Get(in.PID, CodeKey{Image: in.Image, Code: in.Code})
	var none E
	if e == none {
		n.stats.Add(func(s *CodeNamerStats) { s.Unnamed++ })
		return []trace.Line{{Function: n.cfg.Unnamed, SystemName: n.cfg.Unnamed}}, true
	}
	n.stats.Add(func(s *CodeNamerStats) { s.Named++ })
	return n.cfg.Lines(e, in.Offset), true
}

// Pending is how much code waits to be read.
func (n *CodeNamer[E]) Pending() int { return n.codes.Pending() }

// Stats returns the counts so far.
func (n *CodeNamer[E]) Stats() CodeNamerStats {
	st := n.stats.Get()
	cs := n.codes.Stats()
	st.Dropped, st.Rechecks, st.Reused, st.Retries, st.Cached = cs.Dropped, cs.Rechecks, cs.Reused, cs.Retries, cs.Cached
	return st
}

// NamerConfig configures the namer of a runtime whose code is read through the image it
// has in a process (I: what its tracker keeps per process).
type NamerConfig[I any] struct {
	// Images tells which image of the runtime a process runs: the runtime's tracker.
	Images interface{ Image(pid uint32) *I }
	// Memory opens a process's memory; nil means procmem.Process.
	Memory func(pid uint32) procmem.Reader
	// MaxCodes bounds the code kept, read or failed; MaxPending the code waiting to be
	// read; 0 means the runtime's defaults.
	MaxCodes, MaxPending int
	// Recheck is how long code is trusted before it is checked again, when next seen, for
	// other code at its address; 0 means the runtime's default.
	Recheck time.Duration
	// OnReuse hears that an image's runtime gave a code address to other code: the
	// aggregator's RenewImage, so that old locations keep their names.
	OnReuse func(pid uint32, image uint64)
	// Now is time.Now unless a test says otherwise.
	Now func() time.Time
}

// ImageCode is how a runtime reads its code through its image in a process and names it.
type ImageCode[I any, E comparable] struct {
	Read    func(img *I, m procmem.Reader, addr uint64) (E, error)
	Print   func(img *I, m procmem.Reader, addr uint64) ([4]uint64, error)
	PrintOf func(e E) [4]uint64
	Lines   func(e E, offset uint32) []trace.Line
	Unnamed string
	// The defaults of NamerConfig's bounds, and Retry (CodeNamerConfig).
	MaxCodes, MaxPending int
	Recheck, Retry       time.Duration
}

// errGone: the process's image is gone.
var errGone = errors.New("process gone")

// NewImageNamer returns the CodeNamer of a runtime that reads its code as code says.
func NewImageNamer[I any, E comparable](cfg NamerConfig[I], code ImageCode[I, E]) *CodeNamer[E] {
	if cfg.Memory == nil {
		cfg.Memory = func(pid uint32) procmem.Reader { return procmem.Process(pid) }
	}
	return NewCodeNamer(CodeNamerConfig[E]{
		Read: func(pid uint32, addr uint64) (E, bool, error) {
			img := cfg.Images.Image(pid)
			if img == nil {
				var none E
				return none, true, errGone
			}
			e, err := code.Read(img, cfg.Memory(pid), addr)
			return e, false, err
		},
		Print: func(pid uint32, addr uint64) ([4]uint64, bool, error) {
			img := cfg.Images.Image(pid)
			if img == nil {
				return [4]uint64{}, false, nil
			}
			print, err := code.Print(img, cfg.Memory(pid), addr)
			return print, true, err
		},
		PrintOf:    code.PrintOf,
		Lines:      code.Lines,
		Unnamed:    code.Unnamed,
		MaxCodes:   cmp.Or(max(cfg.MaxCodes, 0), code.MaxCodes),
		MaxPending: cmp.Or(max(cfg.MaxPending, 0), code.MaxPending),
		Recheck:    cmp.Or(max(cfg.Recheck, 0), code.Recheck),
		Retry:      code.Retry,
		OnReuse:    cfg.OnReuse,
		Now:        cfg.Now,
	})
}
