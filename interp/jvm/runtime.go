package jvm

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/sonde-profiler/sonde/trace"
)

// Config configures a Runtime.
type Config struct {
	// Kernel is where the walker's per-process state goes.
	Kernel Kernel
	// OnError hears once per file why HotSpot in it cannot be walked.
	OnError func(path string, err error)
	// OnReuse hears that code named for a process's image is other code now: the
	// aggregator's RenewImage.
	OnReuse func(pid uint32, image uint64)
	// MaxBytes bounds all that naming keeps, across processes: half for the frames
	// named, half for the processes' Namers (decoded debug info, methods), each of which
	// keeps at most DefaultMaxBytes of it. 0 means DefaultRuntimeBytes.
	MaxBytes int
	// MaxProcesses bounds the JVMs tracked at once; 0 means DefaultMaxProcesses.
	MaxProcesses int
	// MaxCodes bounds the frames' codes kept named; 0 means DefaultMaxCodes.
	MaxCodes int
	// MaxPending bounds the codes waiting to be read; 0 means DefaultMaxPending.
	MaxPending int
	// Recheck is how long a code read is trusted before it is read again when next
	// seen; 0 means DefaultRecheck.
	Recheck time.Duration
}

// DefaultRuntimeBytes is how much a Runtime's naming keeps unless told otherwise.
const DefaultRuntimeBytes = 64 << 20

// Runtime is HotSpot on this host as a profiler's pipeline drives a language runtime: it
// recognises the processes that run a JVM and tells the kernel how to walk their frames
// (a Tracker, as the process tracker's mapping observer), decodes and names the frames
// the kernel records, and counts what it did.
type Runtime struct {
	tracker *Tracker
	names   *names
	kernel  Kernel
	shared  *budget
}

// New returns HotSpot's Runtime; Run reads the code its frames show.
func New(cfg Config) *Runtime {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultRuntimeBytes
	}
	r := &Runtime{kernel: cfg.Kernel, shared: newBudget(cfg.MaxBytes / 2)}
	r.tracker = NewTracker(TrackerConfig{Kernel: cfg.Kernel, OnError: cfg.OnError, MaxProcesses: cfg.MaxProcesses,
		Namer: NamerConfig{MaxBytes: min(DefaultMaxBytes, cfg.MaxBytes/2), shared: r.shared}})
	r.names = newNames(namesConfig{MaxCodes: cfg.MaxCodes, MaxBytes: cfg.MaxBytes / 2, MaxPending: cfg.MaxPending,
		Recheck: cfg.Recheck, OnReuse: cfg.OnReuse}, r.tracker)
	return r
}

// FrameType names JVM frames.
func (r *Runtime) FrameType() string { return FrameType }

// DecodeFrame splits a frame's payload into its code identity and offset.
func (r *Runtime) DecodeFrame(payload uint64) (code uint64, offset uint32) {
	return DecodeFrame(payload)
}

// SeenCode queues code first seen in an interval to be read while its process lives.
func (r *Runtime) SeenCode(pid uint32, image, code uint64) { r.names.SeenCode(pid, image, code) }

// ProcessMappings looks for HotSpot among a process's mappings.
func (r *Runtime) ProcessMappings(pid uint32, execID uint64, mappings []*trace.Mapping) {
	r.tracker.ProcessMappings(pid, execID, mappings)
}

// ProcessGone forgets a process.
func (r *Runtime) ProcessGone(pid uint32) { r.tracker.ProcessGone(pid) }

// Name names a JVM location: its methods (class-qualified, file, line), innermost first,
// or [jit] and the code blob's name.
func (r *Runtime) Name(loc *trace.Location) ([]trace.Line, bool) { return r.names.Name(loc) }

// Run reads the code SeenCode queued until ctx ends.
func (r *Runtime) Run(ctx context.Context) error { return r.names.Run(ctx) }

// NamesStats returns what naming the kernel's frames did.
func (r *Runtime) NamesStats() NamesStats { return r.names.Stats() }

// WalkCounter is a Kernel that counts how its walks of JVM frames ended, by outcome.
type WalkCounter interface {
	WalkEnds() (map[string]uint64, error)
}

// LogValue reports what the runtime found and named, and how the kernel's walks ended.
func (r *Runtime) LogValue() slog.Value {
	attrs := []slog.Attr{slog.Any("finder", r.tracker.FinderStats()), slog.Any("jvms", r.tracker.Stats()),
		slog.Any("names", r.names.Stats()), slog.Any("namer", r.tracker.NamerStats())}
	if wc, ok := r.kernel.(WalkCounter); ok {
		if ends, err := wc.WalkEnds(); err == nil {
			walks := make([]slog.Attr, 0, len(ends))
			for _, name := range slices.Sorted(maps.Keys(ends)) {
				walks = append(walks, slog.Uint64(name, ends[name]))
			}
			attrs = append(attrs, slog.Attr{Key: "kernel_walks", Value: slog.GroupValue(walks...)})
		}
	}
	return slog.GroupValue(attrs...)
}
