package python

import (
	"context"
	"log/slog"
	"sync"

	"github.com/elastic/go-freelru"

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
}

// Defaults of NamerConfig.
const (
	DefaultMaxCodes   = 1 << 16
	DefaultMaxPending = 4096
)

// NamerStats counts what a Namer did.
type NamerStats struct {
	CodesRead   uint64 // code objects read from processes
	ReadErrors  uint64 // reads that failed: the process exited, or the object was not a code object
	Dropped     uint64 // code objects not read early for a full queue
	Named       uint64 // locations named
	Unnamed     uint64 // locations left unnamed
	UnnamedGone uint64 // of which the process had exited before its code object was read
	CachedCodes int
}

func (s NamerStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Uint64("codes_read", s.CodesRead), slog.Uint64("read_errors", s.ReadErrors),
		slog.Uint64("dropped", s.Dropped), slog.Uint64("named", s.Named), slog.Uint64("unnamed", s.Unnamed),
		slog.Uint64("unnamed_process_gone", s.UnnamedGone), slog.Int("cached_codes", s.CachedCodes))
}

// codeKey is a code object of an image: an address means something in one exec of one
// process only.
type codeKey struct {
	image, code uint64
}

type pendingCode struct {
	pid uint32
	key codeKey
}

// Namer names CPython frames. Code objects are read as soon as a stack holding them is
// first seen in an interval (SeenCode, a trace.InterpObserver), on the Namer's own goroutine,
// so that the process is most likely still there; naming at flush (Name) takes them from the
// cache, reading those it missed then.
type Namer struct {
	cfg    NamerConfig
	mu     sync.Mutex
	codes  *freelru.LRU[codeKey, *Code] // nil *Code: the read failed
	queue  []pendingCode
	queued map[codeKey]bool
	wake   chan struct{}
	stats  NamerStats
}

// NewNamer returns a Namer; Run reads what SeenCode queues.
func NewNamer(cfg NamerConfig) *Namer {
	if cfg.Memory == nil {
		cfg.Memory = func(pid uint32) Memory { return ProcessMemory(pid) }
	}
	if cfg.MaxCodes <= 0 {
		cfg.MaxCodes = DefaultMaxCodes
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	codes, _ := freelru.New[codeKey, *Code](uint32(cfg.MaxCodes), func(k codeKey) uint32 {
		h := k.code>>4 ^ k.image*0x9e3779b97f4a7c15
		return uint32(h ^ h>>32)
	})
	return &Namer{cfg: cfg, codes: codes, queued: map[codeKey]bool{}, wake: make(chan struct{}, 1)}
}

// SeenCode queues a code object to be read, unless it is known or queued already.
func (n *Namer) SeenCode(pid uint32, image, code uint64) {
	k := codeKey{image: image, code: code}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.queued[k] || n.codes.Contains(k) {
		return
	}
	if len(n.queue) >= n.cfg.MaxPending {
		n.stats.Dropped++
		return
	}
	n.queued[k] = true
	n.queue = append(n.queue, pendingCode{pid: pid, key: k})
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// Run reads queued code objects until ctx ends.
func (n *Namer) Run(ctx context.Context) error {
	for {
		n.mu.Lock()
		batch := n.queue
		n.queue = nil
		n.mu.Unlock()
		for _, p := range batch {
			c := n.read(p.pid, p.key.code)
			n.mu.Lock()
			n.codes.Add(p.key, c)
			delete(n.queued, p.key)
			n.mu.Unlock()
		}
		if len(batch) > 0 {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-n.wake:
		}
	}
}

// read reads a code object of the process, or returns nil.
func (n *Namer) read(pid uint32, code uint64) *Code {
	img := n.cfg.Images.Image(pid)
	if img == nil {
		n.count(func(s *NamerStats) { s.ReadErrors++ })
		return nil
	}
	c, err := img.ReadCode(n.cfg.Memory(pid), code)
	n.count(func(s *NamerStats) {
		s.CodesRead++
		if err != nil {
			s.ReadErrors++
		}
	})
	if err != nil {
		return nil
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
	k := codeKey{image: f.Image, code: f.Code}
	n.mu.Lock()
	c, ok := n.codes.Get(k)
	n.mu.Unlock()
	if !ok {
		c = n.read(f.PID, f.Code)
		n.mu.Lock()
		n.codes.Add(k, c)
		n.mu.Unlock()
	}
	if c == nil {
		n.count(func(s *NamerStats) {
			s.Unnamed++
			if !ok && n.cfg.Images.Image(f.PID) == nil {
				s.UnnamedGone++
			}
		})
		return nil, false
	}
	n.count(func(s *NamerStats) { s.Named++ })
	return []trace.Line{{Function: c.Name, SystemName: c.Name, File: c.File, Line: int64(c.Line(int(f.Offset)))}}, true
}

func (n *Namer) count(f func(*NamerStats)) {
	n.mu.Lock()
	f(&n.stats)
	n.mu.Unlock()
}

// Stats returns the counts so far.
func (n *Namer) Stats() NamerStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.stats
	st.CachedCodes = n.codes.Len()
	return st
}
