package node

import (
	"testing"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/interp/interptest"
	"github.com/sonde-profiler/sonde/trace"
)

// TestKernelAgrees holds the package's KernelState and the key of the kernel's function
// memo to the kernel's structs (bpf/v8.h), as the embedded program's BTF describes them.
func TestKernelAgrees(t *testing.T) {
	interptest.CheckKernel(t, map[string]any{"v8_proc": KernelState{}, "v8_code_key": kernelCodeKey{}}, nil)
}

// TestFrameEncodingAgrees holds the package's encoding of V8 frames to what the kernel
// writes (v8.h, enum v8_frame_encoding).
func TestFrameEncodingAgrees(t *testing.T) {
	enc, err := bpf.KernelEnum("interp_frame_encoding")
	if err != nil {
		t.Fatal(err)
	}
	v8, err := bpf.KernelEnum("v8_frame_encoding")
	if err != nil {
		t.Fatal(err)
	}
	if uint64(Number) != v8["V8_RUNTIME"] {
		t.Fatalf("package node numbers its frames %d, the kernel %d", Number, v8["V8_RUNTIME"])
	}
	tag := enc["INTERP_FRAME_TAG"]<<enc["INTERP_FRAME_TAG_SHIFT"] | uint64(Number)<<enc["INTERP_RUNTIME_SHIFT"]
	sfi, off := uint64(0x3a12_3456_7891), uint64(0x123)
	kernel := tag | v8["V8_KIND_BYTECODE"]<<v8["V8_KIND_SHIFT"] | (sfi>>v8["V8_SFI_SHIFT"])<<v8["V8_OFFSET_BITS"] | off
	if got := EncodeBytecodeFrame(sfi, uint32(off)); got != kernel {
		t.Errorf("package node encodes an interpreted frame %#x, the kernel %#x", got, kernel)
	}
	bytecode := uint64(0x3a12_3456_78a1)
	kernel = tag | v8["V8_KIND_BYTECODE_ARRAY"]<<v8["V8_KIND_SHIFT"] | (bytecode>>v8["V8_SFI_SHIFT"])<<v8["V8_OFFSET_BITS"] | off
	if got := EncodeBytecodeArrayFrame(bytecode, uint32(off)); got != kernel {
		t.Errorf("package node encodes an interpreted frame by its bytecode %#x, the kernel %#x", got, kernel)
	}
	pc := uint64(0x7f12_3456_789a)
	kernel = tag | v8["V8_KIND_JIT"]<<v8["V8_KIND_SHIFT"] | 1<<v8["V8_RETURN_BIT"] | pc
	if got := EncodeJITFrame(pc, true); got != kernel {
		t.Errorf("package node encodes a compiled frame %#x, the kernel %#x", got, kernel)
	}
	if _, _, ok := trace.DecodeInterpFrame(kernel); !ok {
		t.Errorf("trace does not decode the kernel's %#x", kernel)
	}
}
