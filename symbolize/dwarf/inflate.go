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
	target int  // len(out) the current fill decodes up to
	lit    *huffman
	dist   *huffman
	dyn    *[2]huffman // a dynamic block's codes, kept from block to block

	sum hash.Hash32 // adler32 of the output, checked at the end of a stream read from its start
	err error
	// onBlock is called where each block begins, but within a window after a block
	// whose call returned a watch: the watch follows the copies from the history.
	onBlock func(bit, out uint64, hist []byte) *refWatch
	watch   *refWatch

	release  func([]byte) // gives back the compressed pages read; may be nil
	released int

	buf *inflateBuf // out's and dyn's memory, back to inflateBufs at close
}

// inflateBuf is an inflater's memory, reused: a pass starts a walk, each with its
// inflater, in each section it needs.
type inflateBuf struct {
	out [outCap]byte
	dyn [2]huffman
}

var inflateBufs = sync.Pool{New: func() any { return new(inflateBuf) }}

// errInflaterClosed is what an inflater gives once closed: its memory is another's.
var errInflaterClosed = errors.New("inflater closed")

func newBuffered(in []byte, pos int, release func([]byte)) *inflater {
	b := inflateBufs.Get().(*inflateBuf)
	return &inflater{in: in, pos: pos, out: b.out[:0], dyn: &b.dyn, release: release, buf: b}
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
	window = 32 << 10 // the farthest a DEFLATE match reaches back
	// outCap is the history and the room to decode past it. A walk reads a page at a
	// time, so more room only slides the history less often: 128 KB of it decoded no
	// faster (BenchmarkInflate 155–171 against 149–160 MB/s) for 100 KB more an
	// inflater, allocated again after each collection empties the pool, three at once
	// where a pass walks .debug_info, .debug_abbrev and .debug_line.
	outCap   = window + 32<<10
	maxCode  = 15 // bits of the longest Huffman code
	maxMatch = 258
	// outLimit is where decoding stops in out: a match begun below it ends, with the
	// word copies' overrun, inside.
	outLimit = outCap - maxMatch - 8
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
	f := newBuffered(in, 2, release)
	f.sum = adler32.New()
	return f, nil
}

// resumeInflater starts on the block that begins at bit of in, hist being the output
// before it (at least window bytes of it, or all of it), and produces the last replay
// bytes of hist first. The checksum is not checked: what came before is not seen.
func resumeInflater(in []byte, bit, out uint64, hist []byte, replay int, release func([]byte)) (*inflater, error) {
	if bit/8 > uint64(len(in)) || replay > len(hist) || uint64(len(hist)) > out || len(hist) > outCap {
		return nil, errInflateCorrupt
	}
	f := newBuffered(in, int(bit/8), release)
	f.released = f.pos &^ (4<<10 - 1)
	f.out = f.out[:len(hist)]
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

// huffman is a canonical Huffman code as tables of entries: a root table indexed by the
// next rootBits bits, and for the longer codes, subtables indexed by the bits after
// those. An entry says what the code decodes to, whole: a literal, a length or distance
// base with the extra bits after it, the end of the block, or where the subtable is, so
// that decoding a symbol is one or two loads, not a search.
type huffman struct {
	root [1 << rootBits]uint32
	sub  []uint32
}

// An entry: bits 0-3 the bits the code takes (in a subtable: past the root), bits 4-7
// the extra bits after it (a subtable's: its index bits), bits 8-10 the kind, bits
// 16-31 the value. An entry of 0 is no code.
const (
	rootBits = 10
	rootMask = 1<<rootBits - 1

	kindLiteral = 0 // value: the byte, or a code length code's symbol
	kindMatch   = 1 // value: a length's or a distance's base
	kindEnd     = 2
	kindSub     = 3 // value: the subtable's offset in sub
	kindInvalid = 4 // a symbol the format does not use (286, 287; distances 30, 31)
)

func codeEntry(kind, value, extra, bits uint32) uint32 {
	return value<<16 | kind<<8 | extra<<4 | bits
}

func entryKind(e uint32) uint32 { return e >> 8 & 7 }

// What a code's symbols mean: build makes each one's entry.
type alphabet uint8

const (
	codeLengths alphabet = iota
	litLen
	distances
)

func (a alphabet) entry(sym int) uint32 {
	switch {
	case a == codeLengths || a == litLen && sym < 256:
		return codeEntry(kindLiteral, uint32(sym), 0, 0)
	case a == litLen && sym == 256:
		return codeEntry(kindEnd, 0, 0, 0)
	case a == litLen && sym-257 < len(lengthBase):
		return codeEntry(kindMatch, uint32(lengthBase[sym-257]), uint32(lengthExtra[sym-257]), 0)
	case a == distances && sym < len(distBase):
		return codeEntry(kindMatch, distBase[sym], uint32(distExtra[sym]), 0)
	}
	return codeEntry(kindInvalid, 0, 0, 0)
}

// build makes the code whose symbol i has lengths[i] bits (0: not used). An
// over-subscribed set of lengths is corrupt; an incomplete one is allowed only as one
// code of one bit, as zlib allows.
func (h *huffman) build(lengths []uint8, a alphabet) error {
	var count [maxCode + 1]uint16
	longest := 0
	for _, l := range lengths {
		count[l]++
		longest = max(longest, int(l))
	}
	count[0] = 0
	left := 1
	for l := 1; l <= maxCode; l++ {
		left = left<<1 - int(count[l])
		if left < 0 {
			return errInflateCorrupt
		}
	}
	if left > 0 && longest > 1 {
		return errInflateCorrupt
	}
	var offs [maxCode + 2]uint16
	for l := 1; l <= maxCode; l++ {
		offs[l+1] = offs[l] + count[l]
	}
	var syms [288]uint16 // symbols in the order of their codes
	for s, l := range lengths {
		if l != 0 {
			syms[offs[l]] = uint16(s)
			offs[l]++
		}
	}
	clear(h.root[:])
	h.sub = h.sub[:0]
	// Codes in order of length then symbol. The stream holds a code's first bit
	// lowest, so tables are indexed by the codes' bits reversed. The codes sharing a
	// root prefix follow each other in this order, so a prefix's subtable is made when
	// its first code comes, as wide as its longest code needs.
	var subLongest [1 << rootBits]uint8
	for pass := range 2 {
		code, i := 0, 0
		for l := 1; l <= longest; l++ {
			for range count[l] {
				sym, c := int(syms[i]), code
				code, i = code+1, i+1
				if l <= rootBits {
					if pass == 1 {
						e := a.entry(sym) | uint32(l)
						for j := reverse(c, l); j < 1<<rootBits; j += 1 << l {
							h.root[j] = e
						}
					}
					continue
				}
				prefix := c >> (l - rootBits)
				if pass == 0 {
					subLongest[prefix] = uint8(l)
					continue
				}
				r := reverse(prefix, rootBits)
				if h.root[r] == 0 {
					sb := int(subLongest[prefix]) - rootBits
					h.root[r] = codeEntry(kindSub, uint32(len(h.sub)), uint32(sb), rootBits)
					h.sub = append(h.sub, make([]uint32, 1<<sb)...)
				}
				off, sb, rest := int(h.root[r]>>16), int(h.root[r]>>4&15), l-rootBits
				e := a.entry(sym) | uint32(rest)
				for j := reverse(c&(1<<rest-1), rest); j < 1<<sb; j += 1 << rest {
					h.sub[off+j] = e
				}
			}
			code <<= 1
		}
	}
	return nil
}

// reverse is the n low bits of code in the opposite order.
func reverse(code, n int) int { return int(bits.Reverse16(uint16(code)) >> (16 - n)) }

// decode reads one code of h and returns its entry.
func (f *inflater) decode(h *huffman) (uint32, bool) {
	f.need(maxCode) // near the end there may be fewer: the checks below say
	e := h.root[f.bits&rootMask]
	if entryKind(e) == kindSub {
		if f.nbits < rootBits {
			return 0, false
		}
		f.drop(rootBits)
		e = h.sub[int(e>>16)+int(f.bits&(1<<(e>>4&15)-1))]
	}
	l := uint(e & 15)
	if l == 0 || l > f.nbits {
		return 0, false
	}
	f.drop(l)
	return e, true
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
	if err := c[0].build(lengths[:], litLen); err != nil {
		panic(err)
	}
	var d [32]uint8 // 30 and 31 complete the code and are no distance
	for i := range d {
		d[i] = 5
	}
	if err := c[1].build(d[:], distances); err != nil {
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
	h := &f.dyn[0] // the code length code first, the literal code after it
	if err := h.build(clen[:], codeLengths); err != nil {
		return err
	}
	var lengths [286 + 30]uint8
	for i := 0; i < nlit+ndist; {
		e, ok := f.decode(h)
		if !ok {
			return f.shortOrCorrupt()
		}
		sym := e >> 16
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
	if err := f.dyn[0].build(lengths[:nlit], litLen); err != nil {
		return err
	}
	if err := f.dyn[1].build(lengths[nlit:nlit+ndist], distances); err != nil {
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

// Read gives the next decompressed bytes, decoding about as many as p asks for.
func (f *inflater) Read(p []byte) (int, error) {
	for f.rd == len(f.out) {
		if f.err != nil {
			return 0, f.err
		}
		f.fill(len(p))
	}
	n := copy(p, f.out[f.rd:])
	f.rd += n
	return n, nil
}

// skip passes over the next n bytes of output without copying them anywhere.
func (f *inflater) skip(n int) (int, error) {
	done := 0
	for done < n {
		if f.rd == len(f.out) {
			if f.err != nil {
				return done, f.err
			}
			f.fill(n - done)
			continue
		}
		k := min(n-done, len(f.out)-f.rd)
		f.rd += k
		done += k
	}
	return done, nil
}

// fill decodes want more bytes, or as many as fit, or until the stream ends or fails.
// Where they would not fit, what was read and is older than the window slides out
// first. The caller has read everything decoded.
func (f *inflater) fill(want int) {
	if len(f.out)+want > outLimit {
		if d := min(f.rd, len(f.out)-window); d > 0 {
			if f.sum != nil {
				f.sum.Write(f.out[:d])
			}
			n := copy(f.out, f.out[d:])
			f.out = f.out[:n]
			f.rd -= d
			f.base += uint64(d)
		}
	}
	if f.release != nil && f.pos-f.released >= releaseStride {
		at := f.pos &^ (4<<10 - 1)
		f.release(f.in[f.released:at])
		f.released = at
	}
	f.target = min(len(f.out)+max(want, 1), outLimit)
	for len(f.out) < f.target && f.err == nil {
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
	if w := f.watch; w != nil && f.base+uint64(len(f.out)) >= w.from+window {
		// Past a window after it, no copy reaches back before it.
		f.watch = nil
		w.done(&w.used)
	}
}

func (f *inflater) header() error {
	if f.final {
		f.state = stateTrailer
		return nil
	}
	if f.onBlock != nil && f.watch == nil {
		f.watch = f.onBlock(f.bitPos(), f.base+uint64(len(f.out)), f.out[max(0, len(f.out)-window):])
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
	for f.stored > 0 && len(f.out) < f.target {
		if f.nbits >= 8 {
			f.out = append(f.out, byte(f.bits))
			f.drop(8)
			f.stored--
			continue
		}
		if f.pos >= len(f.in) {
			return io.ErrUnexpectedEOF
		}
		n := min(f.stored, f.target-len(f.out), len(f.in)-f.pos)
		f.out = append(f.out, f.in[f.pos:f.pos+n]...)
		f.pos += n
		f.stored -= n
	}
	if f.stored == 0 {
		f.state = stateHeader
	}
	return nil
}

// inflate decodes a Huffman block's symbols until out reaches the target or the block
// ends. While eight bytes of input are left, one load fills the bit buffer to at least
// 56 bits, which hold a whole match (a length code and its extra bits, a distance code
// and its extra bits: 48 at most) or two literals, with no check of what is at hand.
func (f *inflater) inflate() error {
	out := f.out[:cap(f.out)]
	n := len(f.out)
	limit := f.target
	lit, dist := f.lit, f.dist
	in := f.in
	bits, nbits, pos := f.bits, f.nbits, f.pos
	save := func() {
		// Past nbits, bits may hold stream bits loaded ahead: need loads them again.
		f.bits, f.nbits, f.pos = bits&(1<<nbits-1), nbits, pos
		f.out = out[:n]
	}
	for n < limit && pos+8 <= len(in) {
		bits |= binary.LittleEndian.Uint64(in[pos:]) << nbits
		pos += int(63-nbits) >> 3
		nbits |= 56
		e := lit.root[bits&rootMask]
		if entryKind(e) == kindSub {
			bits >>= rootBits
			nbits -= rootBits
			e = lit.sub[int(e>>16)+int(bits&(1<<(e>>4&15)-1))]
		}
		l := uint(e & 15)
		bits >>= l
		nbits -= l
		switch {
		case l == 0:
			save()
			return errInflateCorrupt
		case entryKind(e) == kindLiteral:
			out[n] = byte(e >> 16)
			n++
			if e = lit.root[bits&rootMask]; entryKind(e) == kindLiteral && e&15 != 0 {
				bits >>= e & 15
				nbits -= uint(e & 15)
				out[n] = byte(e >> 16)
				n++
			}
			continue
		case entryKind(e) == kindEnd:
			f.state = stateHeader
			save()
			return nil
		case entryKind(e) != kindMatch:
			save()
			return errInflateCorrupt
		}
		x := uint(e >> 4 & 15)
		length := int(e>>16) + int(bits&(1<<x-1))
		bits >>= x
		nbits -= x
		e = dist.root[bits&rootMask]
		if entryKind(e) == kindSub {
			bits >>= rootBits
			nbits -= rootBits
			e = dist.sub[int(e>>16)+int(bits&(1<<(e>>4&15)-1))]
		}
		l = uint(e & 15)
		bits >>= l
		nbits -= l
		x = uint(e >> 4 & 15)
		d := int(e>>16) + int(bits&(1<<x-1))
		bits >>= x
		nbits -= x
		if l == 0 || entryKind(e) != kindMatch || d > n {
			save()
			return errInflateCorrupt // no code, or before the start of the stream
		}
		if f.watch != nil {
			f.watch.note(f.base+uint64(n), d, length)
		}
		copyMatch(out, n, d, length)
		n += length
	}
	save()
	// The input's last bytes, a code at a time.
	for n < limit {
		e, ok := f.decode(lit)
		if !ok {
			f.out = out[:n]
			return f.shortOrCorrupt()
		}
		switch entryKind(e) {
		case kindLiteral:
			out[n] = byte(e >> 16)
			n++
			continue
		case kindEnd:
			f.state = stateHeader
			f.out = out[:n]
			return nil
		case kindMatch:
		default:
			f.out = out[:n]
			return errInflateCorrupt
		}
		extra, ok := f.take(uint(e >> 4 & 15))
		if !ok {
			f.out = out[:n]
			return io.ErrUnexpectedEOF
		}
		length := int(e>>16) + int(extra)
		if e, ok = f.decode(dist); !ok {
			f.out = out[:n]
			return f.shortOrCorrupt()
		}
		if entryKind(e) != kindMatch {
			f.out = out[:n]
			return errInflateCorrupt
		}
		if extra, ok = f.take(uint(e >> 4 & 15)); !ok {
			f.out = out[:n]
			return io.ErrUnexpectedEOF
		}
		d := int(e>>16) + int(extra)
		if d > n {
			f.out = out[:n]
			return errInflateCorrupt // before the start of the stream
		}
		if f.watch != nil {
			f.watch.note(f.base+uint64(n), d, length)
		}
		copyMatch(out, n, d, length)
		n += length
	}
	f.out = out[:n]
	return nil
}

// copyMatch copies length bytes from d back to out[n:], a word at a time where the
// match does not overlap within a word: up to 7 bytes past the match are written, which
// outLimit leaves room for.
func copyMatch(out []byte, n, d, length int) {
	from := n - d
	switch {
	case d >= length && length > 32:
		copy(out[n:n+length], out[from:from+length])
	case d >= 8:
		for i := 0; i < length; i += 8 {
			binary.LittleEndian.PutUint64(out[n+i:], binary.LittleEndian.Uint64(out[from+i:]))
		}
	case d == 1:
		b := out[from]
		for i := n; i < n+length; i++ {
			out[i] = b
		}
	default:
		for i := range length {
			out[n+i] = out[from+i]
		}
	}
}

// refWatch follows which bytes of the window before an output offset the output after
// it copies: a walk resumed there needs no others (see lazySection.mark). Only the
// first window of output after it can reach back so far.
type refWatch struct {
	from uint64              // the offset the window ends at
	used [window / 64]uint64 // bit i: byte from-window+i is copied from
	// done is called once the output is a window past from, with used, or with nil
	// when the inflater closed before: every byte may be copied then.
	done func(used *[window / 64]uint64)
}

// note records the copy of length bytes from d back to at.
func (w *refWatch) note(at uint64, d, length int) {
	src := at - uint64(d)
	if at < w.from || src >= w.from || at >= w.from+window {
		return
	}
	end := min(src+uint64(length), w.from)
	for i := src + window - w.from; i < end+window-w.from; i++ {
		w.used[i/64] |= 1 << (i % 64)
	}
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

// close gives back the compressed pages read that are not yet given back, and the
// inflater's memory; it reads nothing after.
func (f *inflater) close() {
	if w := f.watch; w != nil {
		// Stopped within a window of it, before the stream's end: a later walk may go
		// on to copy any of it.
		f.watch = nil
		if f.state == stateDone {
			w.done(&w.used)
		} else {
			w.done(nil)
		}
	}
	if f.release != nil && f.pos > f.released {
		f.release(f.in[f.released:min(f.pos, len(f.in))])
		f.released = f.pos
	}
	if f.buf != nil {
		inflateBufs.Put(f.buf)
		f.buf, f.out, f.rd, f.dyn, f.lit, f.dist = nil, nil, 0, nil, nil, nil
		f.state, f.err = stateDone, errInflaterClosed
	}
}
