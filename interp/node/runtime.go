package node

import (
	"log/slog"

	"github.com/sonde-profiler/sonde/interp"
)

// Number is V8's number among the runtimes (bpf/v8.h, V8_RUNTIME).
const Number uint8 = 3

// FrameType is OpenTelemetry's profile.frame.type value for V8's JavaScript frames.
const FrameType = "v8js"

// Spec declares V8 (Node.js) to the pipeline (interp.Spec).
var Spec = interp.Spec{
	Name:   "v8",
	Number: Number,
	Maps: interp.KernelMaps{Procs: "v8_procs", Counters: "v8_counters", Ends: "v8_end",
		Sizes: map[string]uint32{"v8_functions": kernelFunctionsMax}},
	State:            KernelState{},
	MemoryBytes:      func(limit int64) int { return int(max(4<<20, limit/16)) },
	FramePointerCode: BuiltinsCode,
	Unsupported:      "V8 whose functions sonde cannot name: its frames are [v8], or native where it cannot walk them",
	New: func(env interp.Env) interp.Runtime {
		return New(Config{Kernel: env.Kernel, OnError: env.OnError, OnReuse: env.OnReuse, MaxBytes: env.MaxBytes})
	},
}

// kernelFunctionsMax sizes the kernel's record of the functions that ran code (compiled
// code's pcs, interpreted frames' BytecodeArrays), v8_functions: an LRU (about 100 bytes
// an entry), read within moments of the samples that wrote it.
const kernelFunctionsMax = 32768

// Config configures a Runtime.
type Config struct {
	Kernel  interp.Kernel
	OnError func(path string, err error)
	OnReuse func(pid uint32, image uint64)
	// MaxBytes bounds what naming keeps across processes (NamerConfig.MaxBytes); 0 means
	// DefaultMaxBytes.
	MaxBytes int
}

// Runtime is V8 on this host as the pipeline drives a language runtime.
type Runtime struct {
	interp.Base
}

// New returns V8's Runtime; Run reads what its frames name.
func New(cfg Config) *Runtime {
	tracker := NewTracker(TrackerConfig{Kernel: cfg.Kernel, OnError: cfg.OnError})
	nc := NamerConfig{Images: tracker, OnReuse: cfg.OnReuse, MaxBytes: cfg.MaxBytes}
	if cfg.Kernel != nil {
		nc.Functions = kernelFunctions{cfg.Kernel}
	}
	namer := NewNamer(nc)
	return &Runtime{interp.Base{Tracker: tracker, Namer: namer, Kernel: cfg.Kernel, Counts: func() []slog.Attr {
		return []slog.Attr{slog.Any("v8", tracker.Stats()), slog.Any("names", namer.Stats())}
	}}}
}

func (r *Runtime) FrameType() string { return FrameType }

func (r *Runtime) DecodeFrame(payload uint64) (code uint64, offset uint32) {
	return DecodeFrame(payload)
}
