package ruby

import (
	"testing"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/interp/interptest"
	"github.com/sonde-profiler/sonde/trace"
)

// TestKernelAgrees holds the package's KernelState, frame encoding and flags to the
// kernel's (bpf/ruby.h), as the embedded program's BTF describes them.
func TestKernelAgrees(t *testing.T) {
	interptest.CheckKernel(t, map[string]any{"ruby_proc": KernelState{}}, map[string]map[string]uint64{
		"ruby_frame_encoding":   {"RUBY_RUNTIME": uint64(Number), "RUBY_ISEQ_ALIGN_SHIFT": iseqAlignShift, "RUBY_POS_BITS": posBits, "RUBY_KIND_METHOD_BIT": kindMethodBit},
		"ruby_magic":            {"RUBY_MAGIC_METHOD": 0x11110001, "RUBY_MAGIC_CFUNC": 0x55550001},
		"ruby_limits":           {"RUBY_MAX_CFP_READ": 64},
		"interp_frame_encoding": {"INTERP_PAYLOAD_BITS": uint64(trace.InterpPayloadBits), "INTERP_RUNTIME_MAX": uint64(trace.InterpRuntimeMax)},
	})
	for minor, l := range layouts {
		if l.CFPSize > 64 || l.ECCFP > 16 || l.ECVMStack > 16 || l.ECVMStackSize > 16 {
			t.Errorf("3.%d: layout %+v past what the kernel reads", minor, l)
		}
	}
}

// TestFrameEncodingAgrees holds the package's decoding of Ruby frames to what the kernel
// writes.
func TestFrameEncodingAgrees(t *testing.T) {
	enc, err := bpf.KernelEnum("interp_frame_encoding")
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []uint64{0, 1} {
		code, pos := uint64(0x7f12_3456_7898), uint32(4242)
		kernel := enc["INTERP_FRAME_TAG"]<<enc["INTERP_FRAME_TAG_SHIFT"] | uint64(Number)<<enc["INTERP_RUNTIME_SHIFT"] |
			kind<<kindMethodBit | (code>>iseqAlignShift)<<posBits | uint64(pos)
		if kind == 1 {
			code |= Method
		}
		if got := EncodeFrame(code, pos); got != kernel {
			t.Errorf("package ruby encodes %#x, the kernel %#x", got, kernel)
		}
		rt, payload, ok := trace.DecodeInterpFrame(kernel)
		if !ok || rt != Number {
			t.Fatalf("trace decodes the kernel's %#x as runtime %d %v", kernel, rt, ok)
		}
		if q, p := DecodeFrame(payload); q != code || p != pos {
			t.Errorf("package ruby decodes the kernel's %#x as %#x+%d", kernel, q, p)
		}
	}
}
