package php

import (
	"log/slog"

	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/trace"
)

// Number is PHP's number among the runtimes, in the frames and code regions the kernel
// keeps (bpf/php.h, PHP_RUNTIME).
const Number uint8 = 5

// FrameType is OpenTelemetry's profile.frame.type value for PHP's frames.
const FrameType = "php"

// How the kernel packs a frame's 58 bits (php.h, enum php_frame_encoding): a kind bit,
// the address >> funcAlignShift, then the line, saturated at lineBits. The address is the
// zend_function's, or for a script's body (kindScriptBit) its file name's zend_string.
const (
	funcAlignShift = 3
	lineBits       = 13
	kindScriptBit  = 57
	funcBits       = kindScriptBit - lineBits
)

// Script marks the code of a frame that runs a script's body: its address is the script's
// file name's, not a zend_function's. No user address has the bit.
const Script = 1 << 63

// EncodeFrame writes a PHP frame as the kernel does, for tests and tools that make
// samples: a function's address (or a script's file name's, with Script) and the line its
// frame runs.
func EncodeFrame(code uint64, line uint32) uint64 {
	p := (code>>funcAlignShift&(1<<funcBits-1))<<lineBits | uint64(min(line, 1<<lineBits-1))
	if code&Script != 0 {
		p |= 1 << kindScriptBit
	}
	return trace.EncodeInterpFrame(Number, p)
}

// DecodeFrame splits a frame's payload into its code (a function's address, or a script's
// file name's with Script) and its line (0: none recorded, an internal function's).
func DecodeFrame(payload uint64) (code uint64, line uint32) {
	code = (payload >> lineBits & (1<<funcBits - 1)) << funcAlignShift
	if payload>>kindScriptBit&1 != 0 {
		code |= Script
	}
	return code, uint32(payload & (1<<lineBits - 1))
}

// Spec declares PHP to the pipeline (interp.Spec).
var Spec = interp.Spec{
	Name:        "php",
	Number:      Number,
	Maps:        interp.KernelMaps{Procs: "php_procs", Counters: "php_counters", Ends: "php_end"},
	State:       KernelState{},
	Unsupported: "php engine whose frames sonde cannot walk; its stacks show the engine's",
	New: func(env interp.Env) interp.Runtime {
		return New(Config{Kernel: env.Kernel, OnError: env.OnError, OnReuse: env.OnReuse})
	},
}

// Config configures a Runtime.
type Config struct {
	// Kernel is where the walker's per-process state goes.
	Kernel interp.Kernel
	// OnError hears once per file why an engine in it cannot be walked.
	OnError func(path string, err error)
	// OnReuse hears that an image's engine gave a function's address to another: the
	// aggregator's RenewImage.
	OnReuse func(pid uint32, image uint64)
}

// Runtime is the Zend engine on this host as the pipeline drives a language runtime: a
// Tracker finds the processes that run it and tells the kernel how to walk them, a Namer
// names the frames the kernel records.
type Runtime struct {
	interp.Base
}

// New returns PHP's Runtime; Run reads the functions its frames name.
func New(cfg Config) *Runtime {
	tracker := NewTracker(TrackerConfig{Kernel: cfg.Kernel, OnError: cfg.OnError})
	namer := NewNamer(NamerConfig{Images: tracker, OnReuse: cfg.OnReuse})
	return &Runtime{interp.Base{Tracker: tracker, Namer: namer, Kernel: cfg.Kernel, Counts: func() []slog.Attr {
		return []slog.Attr{slog.Any("engines", tracker.Stats()), slog.Any("names", namer.Stats())}
	}}}
}

// FrameType names PHP's frames.
func (r *Runtime) FrameType() string { return FrameType }

// DecodeFrame splits a frame's payload into its function's address and line.
func (r *Runtime) DecodeFrame(payload uint64) (code uint64, offset uint32) {
	return DecodeFrame(payload)
}
