package ruby

import (
	"log/slog"

	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/trace"
)

// Number is CRuby's number among the runtimes (bpf/ruby.h, RUBY_RUNTIME).
const Number uint8 = 6

// FrameType is OpenTelemetry's profile.frame.type value for Ruby's frames.
const FrameType = "ruby"

// How the kernel packs a frame's 58 bits (ruby.h, enum ruby_frame_encoding): a kind bit
// (a method entry's address, not an instruction sequence's), the address >>
// iseqAlignShift, then the pc's position in words, saturated at posBits.
const (
	iseqAlignShift = 3
	posBits        = 13
	kindMethodBit  = 57
	iseqBits       = kindMethodBit - posBits
)

// EncodeFrame writes a Ruby frame as the kernel does, for tests and tools that make
// samples: an instruction sequence's address (or a method entry's, with Method) and a
// pc's position in it, in words.
func EncodeFrame(code uint64, pos uint32) uint64 {
	p := (code>>iseqAlignShift&(1<<iseqBits-1))<<posBits | uint64(min(pos, 1<<posBits-1))
	if code&Method != 0 {
		p |= 1 << kindMethodBit
	}
	return trace.EncodeInterpFrame(Number, p)
}

// DecodeFrame splits a frame's payload into what names it, an instruction sequence's
// address or a method entry's (with Method), and the pc's position.
func DecodeFrame(payload uint64) (code uint64, pos uint32) {
	code = (payload >> posBits & (1<<iseqBits - 1)) << iseqAlignShift
	if payload>>kindMethodBit&1 != 0 {
		code |= Method
	}
	return code, uint32(payload & (1<<posBits - 1))
}

// Spec declares CRuby to the pipeline (interp.Spec).
var Spec = interp.Spec{
	Name:        "ruby",
	Number:      Number,
	Maps:        interp.KernelMaps{Procs: "ruby_procs", Counters: "ruby_counters", Ends: "ruby_end"},
	State:       KernelState{},
	Unsupported: "ruby whose frames sonde cannot walk; its stacks show libruby's",
	New: func(env interp.Env) interp.Runtime {
		return New(Config{Kernel: env.Kernel, OnError: env.OnError, OnReuse: env.OnReuse})
	},
}

// Config configures a Runtime.
type Config struct {
	Kernel  interp.Kernel
	OnError func(path string, err error)
	OnReuse func(pid uint32, image uint64)
}

// Runtime is CRuby on this host as the pipeline drives a language runtime.
type Runtime struct {
	interp.Base
}

// New returns CRuby's Runtime; Run reads the instruction sequences its frames name.
func New(cfg Config) *Runtime {
	tracker := NewTracker(TrackerConfig{Kernel: cfg.Kernel, OnError: cfg.OnError})
	namer := NewNamer(NamerConfig{Images: tracker, OnReuse: cfg.OnReuse})
	return &Runtime{interp.Base{Tracker: tracker, Namer: namer, Kernel: cfg.Kernel, Counts: func() []slog.Attr {
		return []slog.Attr{slog.Any("vms", tracker.Stats()), slog.Any("names", namer.Stats())}
	}}}
}

// FrameType names Ruby's frames.
func (r *Runtime) FrameType() string { return FrameType }

// DecodeFrame splits a frame's payload into its instruction sequence and position.
func (r *Runtime) DecodeFrame(payload uint64) (code uint64, offset uint32) {
	return DecodeFrame(payload)
}
