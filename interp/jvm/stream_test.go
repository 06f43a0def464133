package jvm

import (
	"slices"
	"testing"
)

// encodeU5 writes v as UNSIGNED5 with x excluded byte values, as HotSpot's writers do:
// the tests' own encoder, to check the decoder against values of every length.
func encodeU5(v uint32, x byte) []byte {
	l := uint32(u5LowCodes) - uint32(x)
	var out []byte
	for i := 0; ; i++ {
		if v < l || i == u5MaxLen-1 {
			return append(out, byte(v+uint32(x)))
		}
		v -= l
		out = append(out, byte(uint32(x)+l+v%64))
		v >>= 6
	}
}

func encodeSigned(v int32, x byte) []byte { return encodeU5(uint32(v<<1^v>>31), x) }

func TestUnsigned5(t *testing.T) {
	for _, x := range []byte{0, 1} {
		for _, v := range []uint32{0, 1, 190, 191, 192, 0x307e, 0x307f, 0xc207e, 0xc2080, 0x308207f, 0x3082080, 1 << 31, ^uint32(0)} {
			b := encodeU5(v, x)
			s := stream{b: b, x: x}
			got, err := s.uint()
			if err != nil || got != v || s.pos != len(b) {
				t.Errorf("x=%d: %#x encoded % x decodes to %#x after %d bytes, %v", x, v, b, got, s.pos, err)
			}
			if x == 1 && slices.Contains(b, 0) {
				t.Errorf("x=1: %#x encoded % x holds a zero byte", v, b)
			}
		}
		for _, v := range []int32{0, -1, 1, -2, 1000, -1000, 1 << 30, -1 << 31} {
			s := stream{b: encodeSigned(v, x), x: x}
			if got, err := s.signed(); err != nil || got != v {
				t.Errorf("x=%d: signed %d decodes to %d, %v", x, v, got, err)
			}
		}
		// A value cut short is an error, not a read past the end.
		s := stream{b: encodeU5(0x308207f, x)[:2], x: x}
		if _, err := s.uint(); err == nil {
			t.Errorf("x=%d: truncated value decoded", x)
		}
	}
}

// encodeLines writes a line number table as CompressedLineNumberWriteStream does: a
// byte of both deltas when they fit (and the byte is not the escape), else the escape
// and two signed values; a zero byte ends it.
func encodeLines(pairs []LinePair, x byte) []byte {
	var out []byte
	var bci, line int32
	for _, p := range pairs {
		db, dl := p.BCI-bci, p.Line-line
		bci, line = p.BCI, p.Line
		if db >= 0 && db < 32 && dl >= 0 && dl < 8 && db<<3|dl != 0xFF {
			out = append(out, byte(db<<3|dl))
			continue
		}
		out = append(out, 0xFF)
		out = append(out, encodeSigned(db, x)...)
		out = append(out, encodeSigned(dl, x)...)
	}
	return append(out, 0)
}

func TestLineTable(t *testing.T) {
	pairs := []LinePair{{0, 18}, {2, 19}, {11, 20}, {20, 19}, {26, 22}, {31, 29}, {400, 3}, {401, 1000}}
	for _, x := range []byte{0, 1} {
		b := encodeLines(pairs, x)
		b = append(b, 0xAA, 0xBB) // what follows the table is not read
		got, n, err := DecodeLineTable(b, x)
		if err != nil || !slices.Equal(got, pairs) || n != len(b)-2 {
			t.Errorf("x=%d: decoded %v (%d bytes), %v; want %v", x, got, n, err, pairs)
		}
		if _, _, err := DecodeLineTable(b[:len(b)-3], x); err == nil {
			t.Errorf("x=%d: table without its end decoded", x)
		}
	}
	for bci, want := range map[int32]int32{0: 18, 1: 18, 2: 19, 10: 19, 11: 20, 25: 19, 26: 22, 399: 29, 400: 3, 5000: 1000} {
		if got := LineAt(pairs, bci); got != want {
			t.Errorf("bci %d: line %d, want %d", bci, got, want)
		}
	}
	if got := LineAt(nil, 3); got != -1 {
		t.Errorf("no table: line %d", got)
	}
}

// encodeScopes writes a chain of scopes as DebugInformationRecorder does, outermost
// first, each pointing back at its sender, after a byte that keeps offset 0 for null. It
// returns the data and the innermost scope's offset.
func encodeScopes(chain []Scope, x byte) ([]byte, int) {
	data := []byte{0xFF}
	sender := 0
	for i := len(chain) - 1; i >= 0; i-- {
		off := len(data)
		data = append(data, encodeU5(uint32(sender), x)...)
		data = append(data, encodeU5(chain[i].MethodIndex, x)...)
		data = append(data, encodeU5(uint32(chain[i].BCI+1), x)...)
		// The locals, expressions and monitors offsets the reader skips.
		data = append(data, encodeU5(0, x)...)
		sender = off
	}
	return data, sender
}

func TestScopes(t *testing.T) {
	chain := []Scope{{MethodIndex: 3, BCI: 8}, {MethodIndex: 2, BCI: 4}, {MethodIndex: 1, BCI: -1}, {MethodIndex: 400, BCI: 70000}}
	for _, x := range []byte{0, 1} {
		data, off := encodeScopes(chain, x)
		got, err := DecodeScopes(data, off, x, -1)
		if err != nil || !slices.Equal(got, chain) {
			t.Errorf("x=%d: %v, %v; want %v", x, got, err, chain)
		}
		if got, err := DecodeScopes(data, 0, x, -1); err != nil || len(got) != 0 {
			t.Errorf("x=%d: null scope: %v, %v", x, got, err)
		}
		if _, err := DecodeScopes(data, len(data)+5, x, -1); err == nil {
			t.Errorf("x=%d: offset past the data decoded", x)
		}
	}
	// A scope its own sender: a loop, ended by the depth bound.
	loop := append([]byte{0xFF}, encodeU5(1, 0)...)
	loop = append(loop, 1, 1, 1)
	if got, err := DecodeScopes(loop, 1, 0, -1); err == nil || len(got) != maxInlineDepth {
		t.Errorf("looping scopes: %d scopes, %v", len(got), err)
	}
}

func TestModifiedUTF8(t *testing.T) {
	for in, want := range map[string]string{
		"java/lang/String":         "java/lang/String",
		"a\xc0\x80b":               "a\x00b",
		"\xed\xa0\xbd\xed\xb8\x80": "\U0001F600", // a surrogate pair
		"caf\xc3\xa9":              "café",
		"bad\xff":                  "bad\uFFFD",
		"\xed\xa0\xbd":             "\uFFFD", // an unpaired surrogate
	} {
		if got := modifiedUTF8([]byte(in)); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}
