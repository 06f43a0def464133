package node

import (
	"context"
	"log/slog"
	"maps"
	"slices"

	"github.com/sonde-profiler/sonde/trace"
)

// Number is V8's number among the runtimes (bpf/v8.h, V8_RUNTIME).
const Number uint8 = 3

// FrameType is OpenTelemetry's profile.frame.type value for V8's JavaScript frames.
const FrameType = "v8js"

// Config configures a Runtime.
type Config struct {
	Kernel  Kernel
	OnError func(path string, err error)
	OnReuse func(pid uint32, image uint64)
	// MaxBytes bounds what naming keeps across processes (NamerConfig.MaxBytes); 0 means
	// DefaultMaxBytes.
	MaxBytes int
}

// Runtime is V8 on this host as the pipeline drives a language runtime.
type Runtime struct {
	tracker *Tracker
	namer   *Namer
	kernel  Kernel
}

// New returns V8's Runtime; Run reads what its frames name.
func New(cfg Config) *Runtime {
	r := &Runtime{kernel: cfg.Kernel}
	r.tracker = NewTracker(TrackerConfig{Kernel: cfg.Kernel, OnError: cfg.OnError})
	nc := NamerConfig{Images: r.tracker, OnReuse: cfg.OnReuse, MaxBytes: cfg.MaxBytes}
	if f, ok := cfg.Kernel.(FunctionFinder); ok {
		nc.Functions = f
	}
	r.namer = NewNamer(nc)
	return r
}

func (r *Runtime) FrameType() string { return FrameType }

func (r *Runtime) DecodeFrame(payload uint64) (code uint64, offset uint32) {
	return DecodeFrame(payload)
}

func (r *Runtime) SeenCode(pid uint32, image, code uint64) { r.namer.SeenCode(pid, image, code) }

func (r *Runtime) ProcessMappings(pid uint32, execID uint64, mappings []*trace.Mapping) {
	r.tracker.ProcessMappings(pid, execID, mappings)
}

func (r *Runtime) ProcessGone(pid uint32) { r.tracker.ProcessGone(pid) }

func (r *Runtime) Name(loc *trace.Location) ([]trace.Line, bool) { return r.namer.Name(loc) }

func (r *Runtime) Run(ctx context.Context) error { return r.namer.Run(ctx) }

// WalkCounter is a Kernel that counts how its walks of V8 frames ended.
type WalkCounter interface {
	WalkEnds() (map[string]uint64, error)
}

// LogValue reports what the runtime found and named, and how the kernel's walks ended.
func (r *Runtime) LogValue() slog.Value {
	attrs := []slog.Attr{slog.Any("v8", r.tracker.Stats()), slog.Any("names", r.namer.Stats())}
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
