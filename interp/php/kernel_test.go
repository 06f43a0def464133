package php

import (
	"testing"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/interp/interptest"
	"github.com/sonde-profiler/sonde/trace"
)

// TestKernelAgrees holds the package's KernelState, frame encoding and limits to the
// kernel's (bpf/php.h), as the embedded program's BTF describes them.
func TestKernelAgrees(t *testing.T) {
	interptest.CheckKernel(t, map[string]any{"php_proc": KernelState{}}, map[string]map[string]uint64{
		"php_frame_encoding":    {"PHP_RUNTIME": uint64(Number), "PHP_FUNC_ALIGN_SHIFT": funcAlignShift, "PHP_LINE_BITS": lineBits, "PHP_KIND_SCRIPT_BIT": kindScriptBit},
		"php_limits":            {"PHP_CALL_TOP": callTop, "PHP_INTERNAL_FUNCTION": internalFunction},
		"interp_frame_encoding": {"INTERP_PAYLOAD_BITS": uint64(trace.InterpPayloadBits), "INTERP_RUNTIME_MAX": uint64(trace.InterpRuntimeMax)},
	})
}

// TestFrameEncodingAgrees holds the package's decoding of PHP frames, and package trace's
// of every runtime's, to what the kernel writes.
func TestFrameEncodingAgrees(t *testing.T) {
	enc, err := bpf.KernelEnum("interp_frame_encoding")
	if err != nil {
		t.Fatal(err)
	}
	function, line := uint64(0x7f12_3456_7898), uint32(4242)
	script := EncodeFrame(function|Script, line)
	if _, payload, _ := trace.DecodeInterpFrame(script); payload>>kindScriptBit != 1 {
		t.Errorf("a script's frame %#x lacks the kind bit", script)
	} else if c, l := DecodeFrame(payload); c != function|Script || l != line {
		t.Errorf("a script's frame decodes as %#x line %d", c, l)
	}
	kernel := enc["INTERP_FRAME_TAG"]<<enc["INTERP_FRAME_TAG_SHIFT"] | uint64(Number)<<enc["INTERP_RUNTIME_SHIFT"] |
		(function>>funcAlignShift)<<lineBits | uint64(line)
	if got := EncodeFrame(function, line); got != kernel {
		t.Errorf("package php encodes %#x, the kernel %#x", got, kernel)
	}
	rt, payload, ok := trace.DecodeInterpFrame(kernel)
	if !ok || rt != Number {
		t.Fatalf("trace decodes the kernel's %#x as runtime %d %v", kernel, rt, ok)
	}
	if f, l := DecodeFrame(payload); f != function || l != line {
		t.Errorf("package php decodes the kernel's %#x as %#x line %d", kernel, f, l)
	}
	if _, l := DecodeFrame(EncodeFrame(function, 1<<20)); l != 1<<lineBits-1 {
		t.Errorf("a line past the frame's bits decodes as %d, want it saturated", l)
	}
}
