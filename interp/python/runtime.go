package python

import (
	"log/slog"

	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/trace"
)

// Number is CPython's number among the runtimes, in the frames and code regions the kernel
// keeps (bpf/python.h, PY_RUNTIME; package bpf's tests hold the two together).
const Number uint8 = 1

// FrameType is OpenTelemetry's profile.frame.type value for CPython's frames.
const FrameType = "cpython"

// How the kernel packs a frame's 58 bits (python.h, enum py_frame_encoding): the code
// object's address >> codeAlignShift (objects are 16-byte aligned, user addresses below
// 2^47), then the instruction's offset in 2-byte code units, saturated at offsetBits.
const (
	codeAlignShift = 4
	offsetBits     = 15
	codeBits       = trace.InterpPayloadBits - offsetBits
)

// EncodeFrame writes a CPython frame as the kernel does, for tests and tools that make
// samples: a code object's address and an instruction's offset in its bytecode, in bytes.
func EncodeFrame(code uint64, offset uint32) uint64 {
	units := min(uint64(offset/2), 1<<offsetBits-1)
	return trace.EncodeInterpFrame(Number, (code>>codeAlignShift&(1<<codeBits-1))<<offsetBits|units)
}

// DecodeFrame splits a frame's payload into its code object's address and the
// instruction's offset in bytes.
func DecodeFrame(payload uint64) (code uint64, offset uint32) {
	code = (payload >> offsetBits & (1<<codeBits - 1)) << codeAlignShift
	return code, uint32(payload&(1<<offsetBits-1)) * 2
}

// Spec declares CPython to the pipeline (interp.Spec).
var Spec = interp.Spec{
	Name:   "python",
	Number: Number,
	Maps: interp.KernelMaps{Procs: "py_procs", Counters: "py_counters", Ends: "py_end",
		Sizes: map[string]uint32{"py_threads": kernelThreads}},
	State:       KernelState{},
	Unsupported: "python interpreter whose frames sonde cannot walk; its stacks show the interpreter's",
	New: func(env interp.Env) interp.Runtime {
		return New(Config{Kernel: env.Kernel, OnError: env.OnError, OnReuse: env.OnReuse})
	},
}

// kernelThreads sizes the kernel's cache of thread states by thread id (py_threads): an
// LRU, so a host with more Python threads than this searches a thread list now and then.
const kernelThreads = 16384

// Config configures a Runtime.
type Config struct {
	// Kernel is where the walker's per-process state goes.
	Kernel interp.Kernel
	// OnError hears once per file why an interpreter in it cannot be walked.
	OnError func(path string, err error)
	// OnReuse hears that an image's interpreter gave a code object's address to another:
	// the aggregator's RenewImage (NamerConfig.OnReuse).
	OnReuse func(pid uint32, image uint64)
}

// Runtime is CPython on this host as a profiler's pipeline drives a language runtime: it
// recognises the processes that run it and tells the kernel how to walk them (a Tracker,
// as the process tracker's mapping observer), decodes and names the frames the kernel
// records (a Namer), and counts what it did.
type Runtime struct {
	interp.Base
}

// New returns CPython's Runtime; Run reads the code objects its frames name.
func New(cfg Config) *Runtime {
	tracker := NewTracker(TrackerConfig{Kernel: cfg.Kernel, OnError: cfg.OnError})
	namer := NewNamer(NamerConfig{Images: tracker, OnReuse: cfg.OnReuse, OnShim: tracker.SkipCode})
	return &Runtime{interp.Base{Tracker: tracker, Namer: namer, Kernel: cfg.Kernel, Counts: func() []slog.Attr {
		return []slog.Attr{slog.Any("interpreters", tracker.Stats()), slog.Any("names", namer.Stats())}
	}}}
}

// FrameType names CPython's frames.
func (r *Runtime) FrameType() string { return FrameType }

// DecodeFrame splits a frame's payload into its code object's address and offset.
func (r *Runtime) DecodeFrame(payload uint64) (code uint64, offset uint32) {
	return DecodeFrame(payload)
}
