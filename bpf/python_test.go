package bpf

import (
	"testing"

	"github.com/sonde-profiler/sonde/trace"
)

// TestPythonFrameEncodingAgrees holds package trace's decoding of Python frames to what
// the kernel writes (types.h, enum py_frame_encoding).
func TestPythonFrameEncodingAgrees(t *testing.T) {
	code, off := uint64(0x7f12_3456_7890), uint32(0x4242)
	kernel := PythonFrameTag<<PythonFrameTagShift | (code>>PythonCodeAlignShift)<<PythonOffsetBits | uint64(off/2)
	if got := trace.EncodePythonFrame(code, off); got != kernel {
		t.Errorf("trace encodes %#x, the kernel %#x", got, kernel)
	}
	if c, o, ok := trace.PythonFrame(kernel); !ok || c != code || o != off {
		t.Errorf("trace decodes the kernel's %#x as %#x+%d %v", kernel, c, o, ok)
	}
}
