package interp

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/sonde-profiler/sonde/trace"
)

// Namer is the part of a runtime that names its frames: it hears of code as stacks first
// show it, reads it while the process lives (Run), and names locations.
type Namer interface {
	SeenCode(pid uint32, image, code uint64)
	Name(loc *trace.Location) ([]trace.Line, bool)
	Run(ctx context.Context) error
}

// Base is what every runtime's Runtime does alike, for it to embed: processes go to its
// tracker, code and names to its namer, and its counts to the summary with the kernel's
// walks of its frames. The runtime adds FrameType and DecodeFrame.
type Base struct {
	Tracker trace.MappingObserver
	Namer   Namer
	Kernel  Kernel
	// Counts are the runtime's own counts, by group: its tracker's, its namer's.
	Counts func() []slog.Attr
}

// ProcessMappings hands a process's mappings to the tracker.
func (b *Base) ProcessMappings(pid uint32, execID uint64, mappings []*trace.Mapping) {
	b.Tracker.ProcessMappings(pid, execID, mappings)
}

// ProcessGone tells the tracker a process is gone.
func (b *Base) ProcessGone(pid uint32) { b.Tracker.ProcessGone(pid) }

// SeenCode queues code first seen in an interval to be read while its process lives.
func (b *Base) SeenCode(pid uint32, image, code uint64) { b.Namer.SeenCode(pid, image, code) }

// Name names a location of the runtime's.
func (b *Base) Name(loc *trace.Location) ([]trace.Line, bool) { return b.Namer.Name(loc) }

// Run reads what SeenCode queued until ctx is done.
func (b *Base) Run(ctx context.Context) error { return b.Namer.Run(ctx) }

// LogValue reports what the runtime counted, and how the kernel's walks of its frames
// ended (kernel_walks).
func (b *Base) LogValue() slog.Value {
	var attrs []slog.Attr
	if b.Counts != nil {
		attrs = b.Counts()
	}
	if b.Kernel != nil {
		if ends, err := b.Kernel.Ends(); err == nil && ends != nil {
			walks := make([]slog.Attr, 0, len(ends))
			for _, name := range slices.Sorted(maps.Keys(ends)) {
				walks = append(walks, slog.Uint64(name, ends[name]))
			}
			attrs = append(attrs, slog.Attr{Key: "kernel_walks", Value: slog.GroupValue(walks...)})
		}
	}
	return slog.GroupValue(attrs...)
}

// Counts are a part's counters (S, a struct of them), safe for concurrent use.
type Counts[S any] struct {
	mu sync.Mutex
	s  S
}

// Add changes the counters under the lock.
func (c *Counts[S]) Add(f func(*S)) {
	c.mu.Lock()
	f(&c.s)
	c.mu.Unlock()
}

// Get returns the counters.
func (c *Counts[S]) Get() S {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s
}
