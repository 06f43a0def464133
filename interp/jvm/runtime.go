package jvm

import (
	"log/slog"
	"time"

	"github.com/sonde-profiler/sonde/interp"
)

// Spec declares HotSpot to the pipeline (interp.Spec).
var Spec = interp.Spec{
	Name:        "jvm",
	Number:      Number,
	Maps:        interp.KernelMaps{Procs: "jvm_procs", Counters: "jvm_counters", Ends: "jvm_end"},
	State:       kernelProc{},
	MemoryBytes: func(limit int64) int { return int(max(4<<20, limit/16)) },
	Unsupported: "HotSpot JVM whose Java frames sonde cannot walk; its stacks show the JVM's native frames",
	New: func(env interp.Env) interp.Runtime {
		return New(Config{Kernel: env.Kernel, OnError: env.OnError, OnReuse: env.OnReuse, MaxBytes: env.MaxBytes,
			MaxProcesses: env.MaxProcesses})
	},
}

// Config configures a Runtime.
type Config struct {
	// Kernel is where the walker's per-process state goes.
	Kernel interp.Kernel
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
	interp.Base
	tracker *Tracker
	names   *names
	shared  *budget
}

// New returns HotSpot's Runtime; Run reads the code its frames show.
func New(cfg Config) *Runtime {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultRuntimeBytes
	}
	shared := newBudget(cfg.MaxBytes / 2)
	tracker := NewTracker(TrackerConfig{Kernel: cfg.Kernel, OnError: cfg.OnError, MaxProcesses: cfg.MaxProcesses,
		Namer: NamerConfig{MaxBytes: min(DefaultMaxBytes, cfg.MaxBytes/2), shared: shared}})
	names := newNames(namesConfig{MaxCodes: cfg.MaxCodes, MaxBytes: cfg.MaxBytes / 2, MaxPending: cfg.MaxPending,
		Recheck: cfg.Recheck, OnReuse: cfg.OnReuse}, tracker)
	return &Runtime{tracker: tracker, names: names, shared: shared, Base: interp.Base{Tracker: tracker, Namer: names, Kernel: cfg.Kernel, Counts: func() []slog.Attr {
		return []slog.Attr{slog.Any("finder", tracker.FinderStats()), slog.Any("jvms", tracker.Stats()),
			slog.Any("names", names.Stats()), slog.Any("namer", tracker.NamerStats())}
	}}}
}

// FrameType names JVM frames.
func (r *Runtime) FrameType() string { return FrameType }

// DecodeFrame splits a frame's payload into its code identity and offset.
func (r *Runtime) DecodeFrame(payload uint64) (code uint64, offset uint32) {
	return DecodeFrame(payload)
}

// NamesStats returns what naming the kernel's frames did.
func (r *Runtime) NamesStats() NamesStats { return r.names.Stats() }
