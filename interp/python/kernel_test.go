package python

import (
	"testing"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/interp/interptest"
	"github.com/sonde-profiler/sonde/trace"
)

// TestKernelAgrees holds the package's KernelState, frame encoding, frame models and
// limits to the kernel's (bpf/python.h), as the embedded program's BTF describes them, and
// package trace's decoding of every runtime's frames to types.h's.
func TestKernelAgrees(t *testing.T) {
	interptest.CheckKernel(t, map[string]any{"py_proc": KernelState{}}, map[string]map[string]uint64{
		"py_frame_encoding":     {"PY_RUNTIME": uint64(Number), "PY_CODE_ALIGN_SHIFT": codeAlignShift, "PY_OFFSET_BITS": offsetBits},
		"py_frame_model":        {"PY_MODEL_FRAME_OBJECT": modelFrameObject, "PY_MODEL_ENTRY_FLAG": modelEntryFlag, "PY_MODEL_SHIM_FRAME": modelShimFrame},
		"py_limits":             {"PY_NO_OFFSET": kernelNoOffset, "PY_MAX_FRAME_READ": maxFrameRead},
		"interp_frame_encoding": {"INTERP_PAYLOAD_BITS": uint64(trace.InterpPayloadBits), "INTERP_RUNTIME_MAX": uint64(trace.InterpRuntimeMax)},
	})
}

// TestFrameEncodingAgrees holds the package's decoding of Python frames, and package
// trace's of every runtime's, to what the kernel writes (types.h, enum
// interp_frame_encoding; python.h, enum py_frame_encoding).
func TestFrameEncodingAgrees(t *testing.T) {
	enc, err := bpf.KernelEnum("interp_frame_encoding")
	if err != nil {
		t.Fatal(err)
	}
	code, off := uint64(0x7f12_3456_7890), uint32(0x4242)
	kernel := enc["INTERP_FRAME_TAG"]<<enc["INTERP_FRAME_TAG_SHIFT"] | uint64(Number)<<enc["INTERP_RUNTIME_SHIFT"] |
		(code>>codeAlignShift)<<offsetBits | uint64(off/2)
	if got := EncodeFrame(code, off); got != kernel {
		t.Errorf("package python encodes %#x, the kernel %#x", got, kernel)
	}
	rt, payload, ok := trace.DecodeInterpFrame(kernel)
	if !ok || rt != Number {
		t.Fatalf("trace decodes the kernel's %#x as runtime %d %v", kernel, rt, ok)
	}
	if c, o := DecodeFrame(payload); c != code || o != off {
		t.Errorf("package python decodes the kernel's %#x as %#x+%d", kernel, c, o)
	}
}
