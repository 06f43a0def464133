package ruby

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strings"

	"github.com/sonde-profiler/sonde/internal/procmem"
)

// Memory reads a process's memory; ProcessMemory reads a live one's.
type (
	Memory        = procmem.Reader
	ProcessMemory = procmem.Process
)

// Image is a VM as mapped in one process.
type Image struct {
	Version Version
	Layout  Layout
	bias    uint64
	execID  uint64
	// symbols is ruby_global_symbols' address (its last_id) in the process, 0 unknown;
	// lastOpID the highest ID that is its own serial.
	symbols, lastOpID uint64
	jit               [2]uint64 // YJIT's code, as told to the kernel
}

// Iseq is what names the frames of one instruction sequence.
type Iseq struct {
	Label     string // "pluck", "block in harvest", "<main>"; 3.4: "Orchard#pluck"
	File      string
	FirstLine int
	lines     lineTable
	print     [4]uint64 // body, label, path and first line: another sequence shares none
}

// Line returns the line of the instruction at pos (words into the sequence, as the kernel
// records a frame's pc), or the sequence's first line where its table says nothing.
func (q *Iseq) Line(pos uint32) int {
	if l := q.lines.line(pos); l > 0 {
		return l
	}
	return q.FirstLine
}

// Object types of RBasic.flags (ruby_value_type), imemo's kinds, and the flags of strings
// and arrays.
const (
	typeMask     = 0x1f
	typeString   = 0x05
	typeArray    = 0x07
	typeImemo    = 0x1a
	imemoIseq    = 7
	imemoShift   = 12
	imemoMask    = 0x0f
	flNoEmbed    = 1 << 13 // RSTRING_NOEMBED; RARRAY_EMBED_FLAG is the same bit, set when embedded
	strLenShift  = 14      // 3.1's RSTRING_EMBED_LEN_SHIFT
	strLenMask   = 0x1f
	maxString    = 4096
	maxLineInfos = 1 << 16
)

var errNotIseq = errors.New("not an instruction sequence")

// ReadIseq reads the instruction sequence at addr.
func (img *Image) ReadIseq(m Memory, addr uint64) (*Iseq, error) {
	if addr&Method != 0 {
		return img.readMethod(m, addr&^Method)
	}
	l := img.Layout
	var head [24]byte
	if err := m.ReadAt(head[:], addr); err != nil {
		return nil, err
	}
	flags := binary.LittleEndian.Uint64(head[:])
	if flags&typeMask != typeImemo || flags>>imemoShift&imemoMask != imemoIseq {
		return nil, fmt.Errorf("iseq at %#x: flags %#x: %w", addr, flags, errNotIseq)
	}
	body := binary.LittleEndian.Uint64(head[l.IseqBody:])
	b := make([]byte, l.BodyInsnsInfo+32)
	if err := m.ReadAt(b, body); err != nil {
		return nil, fmt.Errorf("iseq at %#x: body: %w", addr, err)
	}
	loc := b[l.BodyLocation:]
	pathobj := binary.LittleEndian.Uint64(loc[0:])
	labelAt := binary.LittleEndian.Uint64(loc[16:])
	first := binary.LittleEndian.Uint64(loc[24:])
	q := &Iseq{FirstLine: int(int64(first) >> 1)}
	q.print = [4]uint64{body, labelAt, pathobj, first}
	var err error
	if q.Label, err = img.readString(m, labelAt); err != nil {
		return nil, fmt.Errorf("iseq at %#x: label: %w", addr, err)
	}
	if q.File, err = img.readPath(m, pathobj); err != nil {
		return nil, fmt.Errorf("iseq at %#x: path: %w", addr, err)
	}
	info := b[l.BodyInsnsInfo:]
	size := binary.LittleEndian.Uint32(info[16:])
	iseqSize := binary.LittleEndian.Uint32(b[l.BodyIseqSize:])
	if q.lines, err = img.readLines(m, binary.LittleEndian.Uint64(info[0:]), binary.LittleEndian.Uint64(info[8:]),
		binary.LittleEndian.Uint64(info[24:]), size, iseqSize); err != nil {
		return nil, fmt.Errorf("iseq at %#x: lines: %w", addr, err)
	}
	return q, nil
}

// readFingerprint reads what tells a sequence from another at the same address.
func (img *Image) readFingerprint(m Memory, addr uint64) ([4]uint64, error) {
	if addr&Method != 0 {
		return img.readMethodFingerprint(m, addr&^Method)
	}
	l := img.Layout
	var print [4]uint64
	body, err := procmem.ReadU64(m, addr+uint64(l.IseqBody))
	if err != nil {
		return print, err
	}
	var loc [32]byte
	if err := m.ReadAt(loc[:], body+uint64(l.BodyLocation)); err != nil {
		return print, err
	}
	return [4]uint64{body, binary.LittleEndian.Uint64(loc[16:]), binary.LittleEndian.Uint64(loc[0:]), binary.LittleEndian.Uint64(loc[24:])}, nil
}

// readString reads a Ruby String.
func (img *Image) readString(m Memory, v uint64) (string, error) {
	l := img.Layout
	var h [40]byte
	if err := m.ReadAt(h[:], v); err != nil {
		return "", err
	}
	flags := binary.LittleEndian.Uint64(h[:])
	if flags&typeMask != typeString {
		return "", fmt.Errorf("string at %#x: type %#x: %w", v, flags&typeMask, errNotIseq)
	}
	var at, n uint64
	switch {
	case flags&flNoEmbed != 0:
		n, at = binary.LittleEndian.Uint64(h[l.StrLen:]), binary.LittleEndian.Uint64(h[l.StrPtr:])
	case l.StrLenInFlags:
		n, at = flags>>strLenShift&strLenMask, v+uint64(l.StrEmbed)
	default:
		n, at = binary.LittleEndian.Uint64(h[l.StrLen:]), v+uint64(l.StrEmbed)
	}
	n = min(n, maxString)
	b := make([]byte, n)
	if err := m.ReadAt(b, at); err != nil {
		return "", err
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), nil
}

// readPath reads an iseq's pathobj: a String, or an Array of the path and the real path.
func (img *Image) readPath(m Memory, v uint64) (string, error) {
	l := img.Layout
	flags, err := procmem.ReadU64(m, v)
	if err != nil {
		return "", err
	}
	if flags&typeMask != typeArray {
		return img.readString(m, v)
	}
	first := v + uint64(l.AryEmbed)
	if flags&flNoEmbed == 0 { // RARRAY_EMBED_FLAG clear: the elements are behind ptr
		if first, err = procmem.ReadU64(m, v+uint64(l.AryPtr)); err != nil {
			return "", err
		}
	}
	path, err := procmem.ReadU64(m, first)
	if err != nil {
		return "", err
	}
	return img.readString(m, path)
}

// lineTable maps a pc's position to its line: the sequence's insn_info entries and where
// each starts, as positions or as CRuby's succinct bitvector of them.
type lineTable struct {
	lines     []int32  // the entries' line_no
	positions []uint32 // where each entry starts; nil: succ says
	succ      []byte   // struct succ_index_table
}

// The succinct bitvector's layout (iseq.c): IMMEDIATE_TABLE_SIZE positions answered by
// 7-bit counts packed nine to a word, then blocks of 512 positions, each a rank, 63 bits
// of 9-bit ranks of its 64-bit words, and the words.
const (
	succImmediate = 54
	succImmWords  = succImmediate / 9
	succBlockBits = 512
	succBlockSize = 4 + 4 + 8 + succBlockBits/8 // rank, padding, small_block_ranks, bits
)

func (img *Image) readLines(m Memory, entries, positions, succ uint64, size, iseqSize uint32) (lineTable, error) {
	var t lineTable
	if size == 0 || entries == 0 {
		return t, nil
	}
	if size > maxLineInfos || iseqSize > maxLineInfos*64 {
		return t, fmt.Errorf("%d line entries over %d words: %w", size, iseqSize, errNotIseq)
	}
	es := img.Layout.InsnInfoEntrySize
	b := make([]byte, int(size)*es)
	if err := m.ReadAt(b, entries); err != nil {
		return t, err
	}
	t.lines = make([]int32, size)
	for i := range t.lines {
		t.lines[i] = int32(binary.LittleEndian.Uint32(b[i*es:]))
	}
	switch {
	case size == 1:
	case positions != 0:
		b := make([]byte, int(size)*4)
		if err := m.ReadAt(b, positions); err != nil {
			return t, err
		}
		t.positions = make([]uint32, size)
		for i := range t.positions {
			t.positions[i] = binary.LittleEndian.Uint32(b[i*4:])
		}
	case succ != 0:
		n := succImmWords * 8
		if iseqSize > succImmediate {
			n += int((iseqSize-succImmediate+succBlockBits-1)/succBlockBits) * succBlockSize
		}
		t.succ = make([]byte, n)
		if err := m.ReadAt(t.succ, succ); err != nil {
			return t, err
		}
	}
	return t, nil
}

// line returns the line of the instruction at pos, or 0. The kernel's pos is where the pc
// points, the next instruction's start: the instruction running is the one before, as
// CRuby's own backtraces count.
func (t lineTable) line(pos uint32) int {
	if len(t.lines) == 0 {
		return 0
	}
	if pos > 0 {
		pos--
	}
	i := 0
	switch {
	case len(t.lines) == 1:
	case t.positions != nil:
		for i+1 < len(t.positions) && t.positions[i+1] <= pos {
			i++
		}
	case t.succ != nil:
		rank, ok := succRank(t.succ, pos)
		if !ok || rank == 0 {
			return 0
		}
		i = rank - 1
	default:
		return 0
	}
	if i >= len(t.lines) {
		return 0
	}
	return int(t.lines[i])
}

// succRank counts the entries starting at or before pos in a succinct index table.
func succRank(table []byte, pos uint32) (int, bool) {
	if pos < succImmediate {
		w := binary.LittleEndian.Uint64(table[(pos/9)*8:])
		return int(w >> ((pos % 9) * 7) & 0x7f), true
	}
	x := pos - succImmediate
	block := int(succImmWords*8) + int(x/succBlockBits)*succBlockSize
	if block+succBlockSize > len(table) {
		return 0, false
	}
	b := table[block:]
	rank := int(binary.LittleEndian.Uint32(b))
	small := binary.LittleEndian.Uint64(b[8:])
	bit := x % succBlockBits
	word := bit / 64
	if word > 0 {
		rank += int(small >> ((word - 1) * 9) & 0x1ff)
	}
	w := binary.LittleEndian.Uint64(b[16+word*8:])
	return rank + bits.OnesCount64(w<<(63-bit%64)), true
}
