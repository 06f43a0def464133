package bpf

import (
	"testing"

	"github.com/sonde-profiler/sonde/interp/node"
	"github.com/sonde-profiler/sonde/trace"
)

// TestV8FrameEncodingAgrees holds package node's decoding of V8 frames to what the kernel
// writes (v8.h, enum v8_frame_encoding).
func TestV8FrameEncodingAgrees(t *testing.T) {
	if node.Number != V8Runtime {
		t.Fatalf("package node numbers its frames %d, the kernel %d", node.Number, V8Runtime)
	}
	tag := InterpFrameTag<<InterpFrameTagShift | uint64(V8Runtime)<<InterpRuntimeShift
	sfi, off := uint64(0x3a12_3456_7891), uint64(0x123)
	kernel := tag | V8KindBytecode<<V8KindShift | (sfi>>V8SFIShift)<<V8OffsetBits | off
	if got := node.EncodeBytecodeFrame(sfi, uint32(off)); got != kernel {
		t.Errorf("package node encodes an interpreted frame %#x, the kernel %#x", got, kernel)
	}
	bytecode := uint64(0x3a12_3456_78a1)
	kernel = tag | V8KindBytecodeArray<<V8KindShift | (bytecode>>V8SFIShift)<<V8OffsetBits | off
	if got := node.EncodeBytecodeArrayFrame(bytecode, uint32(off)); got != kernel {
		t.Errorf("package node encodes an interpreted frame by its bytecode %#x, the kernel %#x", got, kernel)
	}
	pc := uint64(0x7f12_3456_789a)
	kernel = tag | V8KindJIT<<V8KindShift | 1<<V8ReturnBit | pc
	if got := node.EncodeJITFrame(pc, true); got != kernel {
		t.Errorf("package node encodes a compiled frame %#x, the kernel %#x", got, kernel)
	}
	if _, _, ok := trace.DecodeInterpFrame(kernel); !ok {
		t.Errorf("trace does not decode the kernel's %#x", kernel)
	}
}
