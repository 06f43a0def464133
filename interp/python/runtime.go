package python

import (
	"context"
	"log/slog"
	"maps"
	"slices"

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

// Config configures a Runtime.
type Config struct {
	// Kernel is where the walker's per-process state goes.
	Kernel Kernel
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
	tracker *Tracker
	namer   *Namer
	kernel  Kernel
}

// New returns CPython's Runtime; Run reads the code objects its frames name.
func New(cfg Config) *Runtime {
	r := &Runtime{kernel: cfg.Kernel}
	r.tracker = NewTracker(TrackerConfig{Kernel: cfg.Kernel, OnError: cfg.OnError})
	r.namer = NewNamer(NamerConfig{Images: r.tracker, OnReuse: cfg.OnReuse, OnShim: r.tracker.SkipCode})
	return r
}

// FrameType names CPython's frames.
func (r *Runtime) FrameType() string { return FrameType }

// DecodeFrame splits a frame's payload into its code object's address and offset.
func (r *Runtime) DecodeFrame(payload uint64) (code uint64, offset uint32) {
	return DecodeFrame(payload)
}

// SeenCode queues a code object first seen in an interval to be read while its process lives.
func (r *Runtime) SeenCode(pid uint32, image, code uint64) { r.namer.SeenCode(pid, image, code) }

// ProcessMappings looks for an interpreter among a process's mappings.
func (r *Runtime) ProcessMappings(pid uint32, execID uint64, mappings []*trace.Mapping) {
	r.tracker.ProcessMappings(pid, execID, mappings)
}

// ProcessGone forgets a process.
func (r *Runtime) ProcessGone(pid uint32) { r.tracker.ProcessGone(pid) }

// Name names a CPython location: qualified name, file and line.
func (r *Runtime) Name(loc *trace.Location) ([]trace.Line, bool) { return r.namer.Name(loc) }

// Run reads the code objects SeenCode queued until ctx is done.
func (r *Runtime) Run(ctx context.Context) error { return r.namer.Run(ctx) }

// WalkCounter is a Kernel that counts how its walks of Python frames ended, by outcome.
type WalkCounter interface {
	WalkEnds() (map[string]uint64, error)
}

// LogValue reports what the runtime found and named, and how the kernel's walks ended.
func (r *Runtime) LogValue() slog.Value {
	attrs := []slog.Attr{slog.Any("interpreters", r.tracker.Stats()), slog.Any("names", r.namer.Stats())}
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
