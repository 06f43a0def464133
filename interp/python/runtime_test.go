package python

import (
	"testing"

	"github.com/sonde-profiler/sonde/trace"
)

func TestFrameEncoding(t *testing.T) {
	for _, c := range []struct {
		code   uint64
		offset uint32
	}{{0x7f12_3456_7890, 0}, {0x10, 2}, {1<<47 - 16, 1<<16 - 2}, {0x5555_0000_0000, 1234}} {
		v := EncodeFrame(c.code, c.offset)
		rt, payload, ok := trace.DecodeInterpFrame(v)
		if !ok || rt != Number {
			t.Fatalf("%#x+%d: encoded %#x, runtime %d %v", c.code, c.offset, v, rt, ok)
		}
		if code, off := DecodeFrame(payload); code != c.code || off != c.offset {
			t.Errorf("%#x+%d: encoded %#x, decoded %#x+%d", c.code, c.offset, v, code, off)
		}
	}
	// Past 64 KiB of bytecode the offset saturates rather than spilling into the code.
	if code, off := DecodeFrame(EncodeFrame(0x7f00_0000_1000, 1<<20) & (1<<trace.InterpPayloadBits - 1)); code != 0x7f00_0000_1000 || off != 1<<16-2 {
		t.Errorf("a large offset decodes as %#x+%d", code, off)
	}
}
