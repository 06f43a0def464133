package dwarf

import (
	"encoding/binary"
	"errors"
	"hash"
	"hash/adler32"
	"io"
	"math/bits"
	"sync"
)

// inflater decodes a zlib stream (RFC 1950 around RFC 1951's DEFLATE) as any
// decompressor does, and also tells where its blocks begin, so that it can later be
// started again at one of them from the 32 KB of output before it: a section compressed
// whole is then entered near the unit a naming pass needs instead of decompressed from
// its start each time (lazySection's marks). The libraries' decompressors keep that
// state to themselves.
//
// The input is hostile: every length, distance and code is checked, and what does not
// decode is an error, never a read out of bounds.
type inflater struct {
	in    []byte
	pos   int    // next byte of in to load into bits
	bits  uint64 // the next nbits bits of the stream, least significant first
	nbits uint

	out  []byte // the history, then what is not read yet, up to outCap
	rd   int    // out[rd:] is not read yet
	base uint64 // offset in the output of out[0]

	state  inflateState
	final  bool // the block being decoded is the last
	stored int  // bytes left of a stored block
	lit    *huffman
	dist   *huffman
	dyn    *[2]huffman // a dynamic block's codes, kept from block to block

	sum     hash.Hash32 // adler32 of the output, checked at the end of a stream read from its start
	err     error
	onBlock func(bit, out uint64, hist []byte) // called where each block begins

	release  func([]byte) // gives back the compressed pages read; may be nil
	released int
}

type inflateState uint8

const (
	stateHeader inflateState = iota
	stateStored
	stateHuffman
	stateTrailer
	stateDone
)

const (
	window  = 32 << 10 // the farthest a DEFLATE match reaches back
	outCap  = window + 64<<10
	maxCode = 15 // bits of the longest Huffman code
	// fastBits is the width of a code table's direct lookup: the rarer, longer codes
	// are decoded a bit at a time.
	fastBits = 10
	maxMatch = 258
)

var (
	errInflateCorrupt = errors.New("corrupt deflate stream")
	errZlibHeader     = errors.New("not a zlib stream")
	errZlibChecksum   = errors.New("zlib checksum mismatch")
)

// newInflater starts on a zlib stream at its header.
func newInflater(in []byte, release func([]byte)) (*inflater, error) {
	if len(in) < 2 {
		return nil, errZlibHeader
	}
	cmf, flg := in[0], in[1]
	if cmf&0x0f != 8 || cmf>>4 > 7 || (uint16(cmf)<<8|uint16(flg))%31 != 0 || flg&0x20 != 0 {
		return nil, errZlibHeader
	}
	f := &inflater{in: in, pos: 2, out: make([]byte, 0, outCap), sum: adler32.New(), release: release}
	return f, nil
}

// resumeInflater starts on the block that begins at bit of in, hist being the output
// before it (at least window bytes of it, or all of it), and produces the last replay
// bytes of hist first. The checksum is not checked: what came before is not seen.
func resumeInflater(in []byte, bit, out uint64, hist []byte, replay int, release func([]byte)) (*inflater, error) {
	if bit/8 > uint64(len(in)) || replay > len(hist) || uint64(len(hist)) > out || len(hist) > outCap {
		return nil, errInflateCorrupt
	}
	f := &inflater{in: in, pos: int(bit / 8), out: make([]byte, len(hist), outCap),
		release: release, released: int(bit/8) &^ (4<<10 - 1)}
	copy(f.out, hist)
	f.rd = len(hist) - replay
	f.base = out - uint64(len(hist))
	if skip := uint(bit % 8); skip > 0 {
		if !f.need(skip) {
			return nil, io.ErrUnexpectedEOF
		}
		f.drop(skip)
	}
	return f, nil
}

// bitPos is the offset in bits of the next bit of in to decode.
func (f *inflater) bitPos() uint64 { return uint64(f.pos)*8 - uint64(f.nbits) }

// need loads bits until n are at hand, and says whether the input had them.
func (f *inflater) need(n uint) bool {
	if f.nbits >= n {
		return true
	}
	if f.pos+8 <= len(f.in) {
		v := binary.LittleEndian.Uint64(f.in[f.pos:])
		k := (63 - f.nbits) / 8
		f.bits |= v << f.nbits
		f.nbits += k * 8
		f.bits &= 1<<f.nbits - 1
		f.pos += int(k)
		return f.nbits >= n
	}
	for f.nbits < n {
		if f.pos >= len(f.in) {
			return false
		}
		f.bits |= uint64(f.in[f.pos]) << f.nbits
		f.pos++
		f.nbits += 8
	}
	return true
}

func (f *inflater) drop(n uint) {
	f.bits >>= n
	f.nbits -= n
}

// take reads n bits, n at most 32.
func (f *inflater) take(n uint) (uint32, bool) {
	if !f.need(n) {
		return 0, false
	}
	v := uint32(f.bits & (1<<n - 1))
	f.drop(n)
	return v, true
}

// huffman is a canonical Huffman code: a direct table for the codes of up to fastBits
// bits, and the counts and symbols of every length for the rest.
type huffman struct {
	fast  [1 << fastBits]uint16 // symbol<<4 | length; 0 where no short code begins
	count [maxCode + 1]uint16
	syms  [288]uint16 // symbols in the order of their codes
	max   uint        // longest length
}

// build makes the code whose symbol i has lengths[i] bits (0: not used). An
// over-subscribed set of lengths is corrupt; an incomplete one is allowed only as one
// code of one bit, as zlib allows.
func (h *huffman) build(lengths []uint8) error {
	clear(h.fast[:])
	clear(h.count[:])
	h.max = 0
	for _, l := range lengths {
		h.count[l]++
		h.max = max(h.max, uint(l))
	}
	h.count[0] = 0
	left := 1
	for l := 1; l <= maxCode; l++ {
		left = left<<1 - int(h.count[l])
		if left < 0 {
			return errInflateCorrupt
		}
	}
	if left > 0 && h.max > 1 {
		return errInflateCorrupt
	}
	var offs [maxCode + 2]uint16
	for l := 1; l <= maxCode; l++ {
		offs[l+1] = offs[l] + h.count[l]
	}
	for s, l := range lengths {
		if l != 0 {
			h.syms[offs[l]] = uint16(s)
			offs[l]++
		}
	}
	// The direct table: codes in order of length then symbol, bit-reversed, since the
	// stream holds a code's first bit lowest.
	code, i := 0, 0
	for l := uint(1); l <= min(h.max, fastBits); l++ {
		for range h.count[l] {
			rev := reverse(uint16(code), l)
			for j := int(rev); j < 1<<fastBits; j += 1 << l {
				h.fast[j] = h.syms[i]<<4 | uint16(l)
			}
			code++
			i++
		}
		code <<= 1
	}
	return nil
}

func reverse(code uint16, n uint) uint16 {
	var r uint16
	for range n {
		r = r<<1 | code&1
		code >>= 1
	}
	return r
}

// decode reads one symbol of h.
func (f *inflater) decode(h *huffman) (int, bool) {
	f.need(maxCode) // near the end there may be fewer: the checks below say
	if e := h.fast[f.bits&(1<<fastBits-1)]; e != 0 && uint(e&15) <= f.nbits {
		f.drop(uint(e & 15))
		return int(e >> 4), true
	}
	// A bit at a time, comparing the code read so far with the first code of each length.
	code, first, index := 0, 0, 0
	for l := uint(1); l <= h.max; l++ {
		if f.nbits < l {
			return 0, false
		}
		code |= int(f.bits>>(l-1)) & 1
		count := int(h.count[l])
		if code-first < count {
			f.drop(l)
			return int(h.syms[index+code-first]), true
		}
		index += count
		first = (first + count) << 1
		code <<= 1
	}
	return 0, false
}

var lengthBase = [29]uint16{3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258}
var lengthExtra = [29]uint8{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0}
var distBase = [30]uint32{1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577}
var distExtra = [30]uint8{0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13}

// fixedCodes are the codes of the blocks that use RFC 1951's fixed Huffman codes.
var fixedCodes = sync.OnceValue(func() *[2]huffman {
	var c [2]huffman
	var lengths [288]uint8
	for i := range lengths {
		switch {
		case i < 144:
			lengths[i] = 8
		case i < 256:
			lengths[i] = 9
		case i < 280:
			lengths[i] = 7
		default:
			lengths[i] = 8
		}
	}
	if err := c[0].build(lengths[:]); err != nil {
		panic(err)
	}
	var d [32]uint8 // 30 and 31 complete the code and are no distance
	for i := range d {
		d[i] = 5
	}
	if err := c[1].build(d[:]); err != nil {
		panic(err)
	}
	return &c
})

// codeOrder is the order of the code length code's lengths in a dynamic block header.
var codeOrder = [19]uint8{16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15}

// readDynamic reads a dynamic block's code definitions.
func (f *inflater) readDynamic() error {
	v, ok := f.take(14)
	if !ok {
		return io.ErrUnexpectedEOF
	}
	nlit, ndist, nclen := int(v&31)+257, int(v>>5&31)+1, int(v>>10)+4
	if nlit > 286 || ndist > 30 {
		return errInflateCorrupt
	}
	var clen [19]uint8
	for i := range nclen {
		l, ok := f.take(3)
		if !ok {
			return io.ErrUnexpectedEOF
		}
		clen[codeOrder[i]] = uint8(l)
	}
	if f.dyn == nil {
		f.dyn = new([2]huffman)
	}
	h := &f.dyn[0] // the code length code first, the literal code after it
	if err := h.build(clen[:]); err != nil {
		return err
	}
	var lengths [286 + 30]uint8
	for i := 0; i < nlit+ndist; {
		sym, ok := f.decode(h)
		if !ok {
			return f.shortOrCorrupt()
		}
		if sym < 16 {
			lengths[i] = uint8(sym)
			i++
			continue
		}
		var rep uint32
		var l uint8
		switch sym {
		case 16:
			if i == 0 {
				return errInflateCorrupt
			}
			l = lengths[i-1]
			rep, ok = f.take(2)
			rep += 3
		case 17:
			rep, ok = f.take(3)
			rep += 3
		default:
			rep, ok = f.take(7)
			rep += 11
		}
		if !ok {
			return io.ErrUnexpectedEOF
		}
		if i+int(rep) > nlit+ndist {
			return errInflateCorrupt
		}
		for range rep {
			lengths[i] = l
			i++
		}
	}
	if lengths[256] == 0 {
		return errInflateCorrupt // no end of block
	}
	if err := f.dyn[0].build(lengths[:nlit]); err != nil {
		return err
	}
	if err := f.dyn[1].build(lengths[nlit : nlit+ndist]); err != nil {
		return err
	}
	f.lit, f.dist = &f.dyn[0], &f.dyn[1]
	return nil
}

// shortOrCorrupt is the error of a code that did not decode: the input ended, or
// the bits are no code.
func (f *inflater) shortOrCorrupt() error {
	if f.pos >= len(f.in) {
		return io.ErrUnexpectedEOF
	}
	return errInflateCorrupt
}

// Read gives the next decompressed bytes.
func (f *inflater) Read(p []byte) (int, error) {
	for f.rd == len(f.out) {
		if f.err != nil {
			return 0, f.err
		}
		f.fill()
	}
	n := copy(p, f.out[f.rd:])
	f.rd += n
	return n, nil
}

// fill decodes until out is full or the stream ends or fails, sliding what was read
// and is older than the window out first.
func (f *inflater) fill() {
	if d := min(f.rd, len(f.out)-window); d > 0 {
		if f.sum != nil {
			f.sum.Write(f.out[:d])
		}
		n := copy(f.out, f.out[d:])
		f.out = f.out[:n]
		f.rd -= d
		f.base += uint64(d)
	}
	if f.release != nil && f.pos-f.released >= releaseStride {
		at := f.pos &^ (4<<10 - 1)
		f.release(f.in[f.released:at])
		f.released = at
	}
	for len(f.out) < outCap-maxMatch && f.err == nil {
		switch f.state {
		case stateHeader:
			f.err = f.header()
		case stateStored:
			f.err = f.copyStored()
		case stateHuffman:
			f.err = f.inflate()
		case stateTrailer:
			f.err = f.trailer()
		case stateDone:
			f.err = io.EOF
		}
	}
}

func (f *inflater) header() error {
	if f.final {
		f.state = stateTrailer
		return nil
	}
	if f.onBlock != nil {
		f.onBlock(f.bitPos(), f.base+uint64(len(f.out)), f.out[max(0, len(f.out)-window):])
	}
	v, ok := f.take(3)
	if !ok {
		return io.ErrUnexpectedEOF
	}
	f.final = v&1 != 0
	switch v >> 1 {
	case 0:
		f.drop(f.nbits % 8)
		v, ok := f.take(32)
		if !ok {
			return io.ErrUnexpectedEOF
		}
		if uint16(v) != ^uint16(v>>16) {
			return errInflateCorrupt
		}
		f.stored, f.state = int(uint16(v)), stateStored
	case 1:
		c := fixedCodes()
		f.lit, f.dist, f.state = &c[0], &c[1], stateHuffman
	case 2:
		if err := f.readDynamic(); err != nil {
			return err
		}
		f.state = stateHuffman
	default:
		return errInflateCorrupt
	}
	return nil
}

func (f *inflater) copyStored() error {
	for f.stored > 0 && len(f.out) < outCap-maxMatch {
		if f.nbits >= 8 {
			f.out = append(f.out, byte(f.bits))
			f.drop(8)
			f.stored--
			continue
		}
		if f.pos >= len(f.in) {
			return io.ErrUnexpectedEOF
		}
		n := min(f.stored, outCap-maxMatch-len(f.out), len(f.in)-f.pos)
		f.out = append(f.out, f.in[f.pos:f.pos+n]...)
		f.pos += n
		f.stored -= n
	}
	if f.stored == 0 {
		f.state = stateHeader
	}
	return nil
}

// inflate decodes a Huffman block's symbols until out is full or the block ends.
func (f *inflater) inflate() error {
	out := f.out[:cap(f.out)]
	n := len(f.out)
	defer func() { f.out = out[:n] }()
	for n < outCap-maxMatch {
		sym, ok := f.decode(f.lit)
		if !ok {
			return f.shortOrCorrupt()
		}
		if sym < 256 {
			out[n] = byte(sym)
			n++
			continue
		}
		if sym == 256 {
			f.state = stateHeader
			return nil
		}
		sym -= 257
		if sym >= len(lengthBase) {
			return errInflateCorrupt
		}
		extra, ok := f.take(uint(lengthExtra[sym]))
		if !ok {
			return io.ErrUnexpectedEOF
		}
		length := int(lengthBase[sym]) + int(extra)
		ds, ok := f.decode(f.dist)
		if !ok {
			return f.shortOrCorrupt()
		}
		if ds >= len(distBase) {
			return errInflateCorrupt
		}
		extra, ok = f.take(uint(distExtra[ds]))
		if !ok {
			return io.ErrUnexpectedEOF
		}
		d := int(distBase[ds]) + int(extra)
		if d > n {
			return errInflateCorrupt // before the start of the stream
		}
		from := n - d
		if d >= length {
			copy(out[n:n+length], out[from:from+length])
			n += length
			continue
		}
		for end := n + length; n < end; n++ {
			out[n] = out[from]
			from++
		}
	}
	return nil
}

// trailer checks the zlib checksum, big-endian after the last block's byte.
func (f *inflater) trailer() error {
	f.drop(f.nbits % 8)
	v, ok := f.take(32)
	if !ok {
		return io.ErrUnexpectedEOF
	}
	if f.sum != nil {
		f.sum.Write(f.out) // what slid out of out is summed already
		if f.sum.Sum32() != bits.ReverseBytes32(v) {
			return errZlibChecksum
		}
		f.sum = nil
	}
	f.state = stateDone
	return nil
}

// close gives back the compressed pages read that are not yet given back.
func (f *inflater) close() {
	if f.release != nil && f.pos > f.released {
		f.release(f.in[f.released:min(f.pos, len(f.in))])
		f.released = f.pos
	}
}
