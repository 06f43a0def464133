package unwind

import "testing"

// TestRangeAt finds the range holding an address, ends exclusive, and none in a gap.
func TestRangeAt(t *testing.T) {
	ranges := []CodeRange{{0x100, 0x180}, {0x180, 0x200}, {0x300, 0x340}}
	for pc, want := range map[uint64]CodeRange{0x100: ranges[0], 0x17f: ranges[0], 0x180: ranges[1], 0x33f: ranges[2]} {
		if r, ok := RangeAt(ranges, pc); !ok || r != want {
			t.Errorf("%#x: %v %v, want %v", pc, r, ok, want)
		}
	}
	for _, pc := range []uint64{0xff, 0x200, 0x2ff, 0x340} {
		if r, ok := RangeAt(ranges, pc); ok {
			t.Errorf("%#x: %v, want none", pc, r)
		}
	}
}
