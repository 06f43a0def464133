package python

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// Code is what names the frames of one code object.
type Code struct {
	Name      string // co_qualname since 3.11, co_name before
	File      string // co_filename
	FirstLine int
	lines     []lineRange
	// print tells this code object from another at the same address: its first line and
	// the addresses of its names and line table, which another function's would not share.
	print fingerprint
}

type fingerprint [5]uint64

// Line returns the source line of the instruction offset bytes into the bytecode, or
// the function's first line when the table has none for it.
func (c *Code) Line(offset int) int {
	if l := lineAt(c.lines, offset); l > 0 {
		return l
	}
	return c.FirstLine
}

// Bounds on what a code object may make the reader read.
const (
	maxStringChars = 4096    // a name or file name longer than this is cut
	maxLineTable   = 1 << 20 // bytes of line table
	codeHeadSize   = 320     // PyCodeObject up to co_code_adaptive, in every version and build
)

var errNotCode = errors.New("not a code object")

// Image is an interpreter as mapped in one process: its layout and its types' runtime
// addresses.
type Image struct {
	Version  Version
	Layout   Layout
	codeType uint64
	strType  uint64
	byteType uint64
	bias     uint64 // where the tracker placed it, and for which exec
	execID   uint64
	state    KernelState // what the tracker told the kernel
}

// NewImage places an interpreter at a load bias (runtime address - ELF address).
func NewImage(in *Interpreter, bias uint64) *Image {
	return &Image{Version: in.Version, Layout: in.Layout, codeType: in.CodeType + bias, strType: in.UnicodeType + bias, byteType: in.BytesType + bias}
}

// ReadCode reads the code object at addr: its type must be the interpreter's code type,
// its strings and line table the interpreter's string and bytes types.
func (img *Image) ReadCode(m Memory, addr uint64) (*Code, error) {
	var head [codeHeadSize]byte
	if err := m.ReadAt(head[:], addr); err != nil {
		return nil, err
	}
	l := &img.Layout
	u64 := func(off int) uint64 {
		if off < 0 || off+8 > len(head) {
			return 0
		}
		return binary.LittleEndian.Uint64(head[off:])
	}
	if u64(l.ObType) != img.codeType {
		return nil, fmt.Errorf("object at %#x: %w", addr, errNotCode)
	}
	c := &Code{print: img.fingerprint(head[:])}
	if l.CodeFirstLine >= 0 && l.CodeFirstLine+4 <= len(head) {
		c.FirstLine = int(int32(binary.LittleEndian.Uint32(head[l.CodeFirstLine:])))
	}
	var err error
	nameOff := l.CodeQualname
	if nameOff < 0 {
		nameOff = l.CodeName
	}
	if c.Name, err = img.readString(m, u64(nameOff)); err != nil {
		return nil, fmt.Errorf("code object at %#x: name: %w", addr, err)
	}
	if c.File, err = img.readString(m, u64(l.CodeFilename)); err != nil {
		return nil, fmt.Errorf("code object at %#x: file name: %w", addr, err)
	}
	table, err := img.readBytes(m, u64(l.CodeLineTable))
	if err != nil {
		return nil, fmt.Errorf("code object at %#x: line table: %w", addr, err)
	}
	c.lines = decodeLines(img.Version.Minor, table, c.FirstLine)
	return c, nil
}

// fingerprint reads a code object's fingerprint from its head.
func (img *Image) fingerprint(head []byte) fingerprint {
	l := &img.Layout
	var f fingerprint
	for i, off := range []int{l.CodeFirstLine, l.CodeName, l.CodeQualname, l.CodeFilename, l.CodeLineTable} {
		if off >= 0 && off+8 <= len(head) {
			f[i] = binary.LittleEndian.Uint64(head[off:])
		}
	}
	if l.CodeFirstLine >= 0 && l.CodeFirstLine+4 <= len(head) {
		f[0] = uint64(binary.LittleEndian.Uint32(head[l.CodeFirstLine:]))
	}
	return f
}

// readFingerprint reads the fingerprint of the code object at addr, a cheap check that it
// is still the one read before.
func (img *Image) readFingerprint(m Memory, addr uint64) (fingerprint, error) {
	var head [codeHeadSize]byte
	if err := m.ReadAt(head[:], addr); err != nil {
		return fingerprint{}, err
	}
	if binary.LittleEndian.Uint64(head[img.Layout.ObType:]) != img.codeType {
		return fingerprint{}, errNotCode
	}
	return img.fingerprint(head[:]), nil
}

// readString reads a str object: a compact one (what the compiler makes of names and
// file names), ASCII, Latin-1, UCS-2 or UCS-4.
func (img *Image) readString(m Memory, addr uint64) (string, error) {
	l := &img.Layout
	var head [80]byte
	if l.CompactSize > len(head) || l.ASCIISize > len(head) || l.ObType+8 > l.ASCIISize ||
		l.UnicodeLength+8 > l.ASCIISize || l.UnicodeState+4 > l.ASCIISize {
		return "", errors.New("string layout out of range")
	}
	// The ASCII header holds all that is read: a str no longer than it ends there.
	if err := m.ReadAt(head[:l.ASCIISize], addr); err != nil {
		return "", err
	}
	if binary.LittleEndian.Uint64(head[l.ObType:]) != img.strType {
		return "", errors.New("not a str")
	}
	n := binary.LittleEndian.Uint64(head[l.UnicodeLength:])
	state := binary.LittleEndian.Uint32(head[l.UnicodeState:])
	shift := l.stateKindShift()
	kind, compact, ascii := int(state>>shift&7), state>>(shift+3)&1 == 1, state>>(shift+4)&1 == 1
	if !compact {
		return "", errors.New("not a compact str")
	}
	n = min(n, maxStringChars)
	data := addr + uint64(l.CompactSize)
	if ascii {
		data = addr + uint64(l.ASCIISize)
	}
	switch kind {
	case 1, 2, 4:
	default:
		return "", fmt.Errorf("str of kind %d", kind)
	}
	buf := make([]byte, int(n)*kind)
	if err := m.ReadAt(buf, data); err != nil {
		return "", err
	}
	switch kind {
	case 1:
		if ascii {
			return string(toValidUTF8(buf)), nil
		}
		rs := make([]rune, len(buf))
		for i, b := range buf {
			rs[i] = rune(b)
		}
		return string(rs), nil
	case 2:
		u := make([]uint16, n)
		for i := range u {
			u[i] = binary.LittleEndian.Uint16(buf[2*i:])
		}
		return string(utf16.Decode(u)), nil
	default:
		rs := make([]rune, n)
		for i := range rs {
			r := rune(binary.LittleEndian.Uint32(buf[4*i:]))
			if !utf8.ValidRune(r) {
				r = utf8.RuneError
			}
			rs[i] = r
		}
		return string(rs), nil
	}
}

func toValidUTF8(b []byte) []byte {
	for i, c := range b {
		if c >= utf8.RuneSelf {
			b[i] = '?'
		}
	}
	return b
}

// readBytes reads a bytes object, at most maxLineTable bytes of it.
func (img *Image) readBytes(m Memory, addr uint64) ([]byte, error) {
	l := &img.Layout
	var head [64]byte
	if l.BytesData > len(head) || l.ObType+8 > l.BytesData || l.BytesSize+8 > l.BytesData {
		return nil, errors.New("bytes layout out of range")
	}
	if err := m.ReadAt(head[:l.BytesData], addr); err != nil {
		return nil, err
	}
	if binary.LittleEndian.Uint64(head[l.ObType:]) != img.byteType {
		return nil, errors.New("not a bytes object")
	}
	n := binary.LittleEndian.Uint64(head[l.BytesSize:])
	if n > maxLineTable {
		return nil, fmt.Errorf("%d bytes: over the bound of %d", n, maxLineTable)
	}
	b := make([]byte, n)
	return b, m.ReadAt(b, addr+uint64(l.BytesData))
}
