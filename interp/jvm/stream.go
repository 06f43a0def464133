package jvm

import "errors"

var errStreamEnd = errors.New("stream ends inside a value")

// stream reads HotSpot's compressed streams (CompressedReadStream): unsigned 32-bit
// values in UNSIGNED5, Pack200's variable-length code of one to five bytes. JDK 20 made
// the code skip the byte 0 (each byte is the digit plus x = 1) so that a stream can end
// in a NUL; before, x = 0.
type stream struct {
	b   []byte
	pos int
	x   byte
}

const (
	u5LowCodes = 192 // bytes below 192 (+x) end a value; from it on, another follows
	u5MaxLen   = 5
)

func (s *stream) uint() (uint32, error) {
	l := uint32(u5LowCodes) - uint32(s.x)
	var sum uint32
	shift := 0
	for i := 0; i < u5MaxLen; i++ {
		if s.pos >= len(s.b) {
			return 0, errStreamEnd
		}
		c := s.b[s.pos]
		s.pos++
		if c < s.x {
			return 0, errors.New("excluded byte in a compressed value")
		}
		d := uint32(c - s.x)
		sum += d << shift
		if d < l {
			return sum, nil
		}
		shift += 6
	}
	// The fifth byte ends the value whatever it is.
	return sum, nil
}

// signed undoes UNSIGNED5's sign folding (zigzag): 0, -1, 1, -2 … as 0, 1, 2, 3 ….
func (s *stream) signed() (int32, error) {
	v, err := s.uint()
	return int32(v>>1) ^ -int32(v&1), err
}

func (s *stream) byte() (byte, error) {
	if s.pos >= len(s.b) {
		return 0, errStreamEnd
	}
	c := s.b[s.pos]
	s.pos++
	return c, nil
}

// LinePair is one entry of a method's line number table: from BCI on, the code is of
// Line.
type LinePair struct{ BCI, Line int32 }

// maxLinePairs bounds a decoded table: a method has at most 65535 bytes of bytecode.
const maxLinePairs = 1 << 16

// DecodeLineTable decodes a compressed line number table
// (CompressedLineNumberReadStream): a byte per entry holding a bci delta (high 5 bits)
// and a line delta (low 3 bits), or 0xFF followed by both deltas as signed UNSIGNED5
// values, up to a terminating 0 byte. It returns the pairs and the table's length in
// bytes; a table without its terminator in b is an error.
func DecodeLineTable(b []byte, x byte) ([]LinePair, int, error) {
	s := stream{b: b, x: x}
	var out []LinePair
	var bci, line int32
	for len(out) < maxLinePairs {
		c, err := s.byte()
		if err != nil {
			return out, s.pos, err
		}
		switch c {
		case 0:
			return out, s.pos, nil
		case 0xFF:
			db, err := s.signed()
			if err != nil {
				return out, s.pos, err
			}
			dl, err := s.signed()
			if err != nil {
				return out, s.pos, err
			}
			bci += db
			line += dl
		default:
			bci += int32(c >> 3)
			line += int32(c & 7)
		}
		out = append(out, LinePair{bci, line})
	}
	return out, s.pos, errors.New("line number table longer than any method's")
}

// LineAt returns the line of bci as HotSpot does (Method::line_number_from_bci): the
// entry of bci itself, else of the greatest bci below it; -1 when none.
func LineAt(pairs []LinePair, bci int32) int32 {
	bestBCI, best := int32(0), int32(-1)
	for _, p := range pairs {
		if p.BCI == bci {
			return p.Line
		}
		if p.BCI < bci && p.BCI >= bestBCI {
			bestBCI, best = p.BCI, p.Line
		}
	}
	return best
}

// Scope is one level of a compiled frame's inlining (ScopeDesc): the method, as an
// index into the nmethod's metadata, and the bci in it.
type Scope struct {
	MethodIndex uint32
	BCI         int32
}

// maxInlineDepth bounds the scopes decoded for one pc: C2 inlines at most MaxInlineLevel
// (15) deep by default, and no flag makes it more than a few hundred.
const maxInlineDepth = 256

// DecodeScopes decodes the chain of scopes (DebugInfoReadStream) starting at decode
// offset off in scopes data, innermost first: at each, the sender's decode offset, the
// method's metadata index and the bci (stored less entryBCI, InvocationEntryBci: -1, so
// that it is unsigned). Offset 0 (DebugInformationRecorder::serialized_null) ends the chain.
func DecodeScopes(data []byte, off int, x byte, entryBCI int32) ([]Scope, error) {
	var out []Scope
	for off != 0 {
		if len(out) >= maxInlineDepth {
			return out, errors.New("scope chain deeper than any inlining")
		}
		if off < 0 || off >= len(data) {
			return out, errors.New("scope decode offset outside the scopes data")
		}
		s := stream{b: data, pos: off, x: x}
		sender, err := s.uint()
		if err != nil {
			return out, err
		}
		idx, err := s.uint()
		if err != nil {
			return out, err
		}
		bci, err := s.uint()
		if err != nil {
			return out, err
		}
		out = append(out, Scope{MethodIndex: idx, BCI: int32(bci) + entryBCI})
		off = int(sender)
	}
	return out, nil
}
