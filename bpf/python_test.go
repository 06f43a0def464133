package bpf

import (
	"testing"

	"github.com/sonde-profiler/sonde/interp/python"
	"github.com/sonde-profiler/sonde/trace"
)

// TestPythonFrameEncodingAgrees holds package python's decoding of Python frames, and
// package trace's of every runtime's, to what the kernel writes (types.h, enum
// interp_frame_encoding; python.h, enum py_frame_encoding).
func TestPythonFrameEncodingAgrees(t *testing.T) {
	if python.Number != PythonRuntime {
		t.Fatalf("package python numbers its frames %d, the kernel %d", python.Number, PythonRuntime)
	}
	if trace.InterpPayloadBits != InterpPayloadBits || trace.InterpRuntimeMax != InterpRuntimeMax {
		t.Fatalf("package trace: %d payload bits, runtimes up to %d; the kernel %d, %d",
			trace.InterpPayloadBits, trace.InterpRuntimeMax, InterpPayloadBits, InterpRuntimeMax)
	}
	code, off := uint64(0x7f12_3456_7890), uint32(0x4242)
	kernel := InterpFrameTag<<InterpFrameTagShift | uint64(PythonRuntime)<<InterpRuntimeShift |
		(code>>PythonCodeAlignShift)<<PythonOffsetBits | uint64(off/2)
	if got := python.EncodeFrame(code, off); got != kernel {
		t.Errorf("package python encodes %#x, the kernel %#x", got, kernel)
	}
	rt, payload, ok := trace.DecodeInterpFrame(kernel)
	if !ok || rt != PythonRuntime {
		t.Fatalf("trace decodes the kernel's %#x as runtime %d %v", kernel, rt, ok)
	}
	if c, o := python.DecodeFrame(payload); c != code || o != off {
		t.Errorf("package python decodes the kernel's %#x as %#x+%d", kernel, c, o)
	}
}
