package leb128

import "testing"

func TestNumbers(t *testing.T) {
	for _, tc := range []struct {
		b    []byte
		u    uint64
		s    int64
		n    int
		note string
	}{
		{[]byte{0x02}, 2, 2, 1, "one byte"},
		{[]byte{0x7f}, 127, -1, 1, "sign bit of the last byte"},
		{[]byte{0xe5, 0x8e, 0x26}, 624485, 624485, 3, "DWARF's example"},
		{[]byte{0xc0, 0xbb, 0x78}, 1973696, -123456, 3, "DWARF's negative example"},
		{[]byte{0x80, 0x80}, 0, 0, 0, "truncated"},
		{nil, 0, 0, 0, "empty"},
		{[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, 1<<64 - 1, -1, 12, "past 64 bits"},
	} {
		if u, n := Uint(tc.b); u != tc.u || n != tc.n {
			t.Errorf("%s: Uint = %d, %d; want %d, %d", tc.note, u, n, tc.u, tc.n)
		}
		if s, n := Int(tc.b); s != tc.s || n != tc.n {
			t.Errorf("%s: Int = %d, %d; want %d, %d", tc.note, s, n, tc.s, tc.n)
		}
	}
	for u, want := range map[byte]int64{0: 0, 1: -1, 2: 1, 3: -2} {
		if v, n := ZigZag([]byte{u}); v != want || n != 1 {
			t.Errorf("ZigZag(%d) = %d, %d; want %d", u, v, n, want)
		}
	}
}
