// Package leb128 reads the variable-length numbers of DWARF, call frame information and
// V8's tables: seven bits a byte, low bits first, the top bit saying another byte follows.
// Bits past 64 are dropped: the input is hostile, and a number too long is no reason to
// stop reading.
package leb128

// Uint reads an unsigned number from the front of b: its value and how many bytes it took;
// n is 0 when b ends before the number does.
func Uint(b []byte) (v uint64, n int) {
	var shift uint
	for i, c := range b {
		if shift < 64 {
			v |= uint64(c&0x7f) << shift
		}
		shift += 7
		if c&0x80 == 0 {
			return v, i + 1
		}
	}
	return 0, 0
}

// Int reads a signed (two's complement, sign-extended from its last byte's bit 6) number
// from the front of b, as Uint.
func Int(b []byte) (v int64, n int) {
	var shift uint
	for i, c := range b {
		if shift < 64 {
			v |= int64(c&0x7f) << shift
		}
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			return v, i + 1
		}
	}
	return 0, 0
}

// ZigZag reads a zigzag-encoded signed number (V8's VLQ: the sign in bit 0) from the front
// of b, as Uint.
func ZigZag(b []byte) (v int64, n int) {
	u, n := Uint(b)
	return int64(u>>1) ^ -int64(u&1), n
}
