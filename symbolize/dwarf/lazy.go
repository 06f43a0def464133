package dwarf

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/sonde-profiler/sonde/internal/mmapfile"
)

// A compressed .debug_info, .debug_abbrev or .debug_line is decompressed into a
// reserved region of its full size a block at a time, as far as decoding reaches
// into it: the pages of the blocks not written cost nothing. Building the index
// walks .debug_info once from start to end and keeps only the blocks of the units
// the naming pass that loads the file looks up; later passes fill the blocks of their
// new units in one more walk, and every pass's blocks go when it ends (Table.Thin),
// unless the file keeps asking for new units (Table.Hold). The whole copy of libc's
// debug file, 8 MB, was held from the first lookup; its index and first pass now hold
// a few hundred kilobytes of it at a time.
//
// A zstd stream cannot be entered in the middle, so a block behind the stream that is
// not filled costs a walk from the start: a pass asks for its units in the order of
// their offsets (Table.Prepare), and a section walked maxWalks times since the last
// Thin is filled whole by the next walk. A zlib stream (what compressed debug sections
// nearly always are) is decoded by sonde's own inflater, which leaves a mark every
// markEvery bytes of output where a block begins: the bit it begins at and the 32 KB of
// output before it. A walk starts at the last mark before the block it needs, or jumps
// ahead to one, and decompresses under markEvery instead of up to the whole section:
// beside a program that keeps calling C library code not sampled before (perf), those
// walks were a sixth of sonde's steady CPU.

// lazyBlock is the granule of what is filled: a page, since a unit of the C library
// takes 4 KB on average, and a pass's units lie scattered.
const lazyBlock = 4 << 10

// maxWalks bounds the walks from the start a pass makes through one section before
// one fills it whole: a hostile file's references back and forth cost a few
// decompressions, not one per reference.
const maxWalks = 3

// markEvery is the output between two marks of a zlib stream: at most what a walk
// decompresses to reach a block. Where processes come and go, their new C library
// units come a few each interval, and each walks three sections from the mark before
// it: a megabyte between marks was 30–40 MB decompressed a minute, and at 256 KB the
// walks were still a third of sonde's CPU beside 120 execs a second. A mark keeps of
// its 32 KB of history only what a walk from it reads (see mark), compressed with S2,
// about 6 KB: libc's debug file has 101 marks every 64 KB, 581 KB in all, where its 56
// every 128 KB held 1.07 MB with their whole windows, and a pass meeting three new
// units of libc costs 2.3–2.9 ms instead of 4.2–4.6 (BenchmarkNewUnits).
const markEvery = 64 << 10

// packChunk is the output a packed section keeps as one S2 block: decoding one costs
// tens of microseconds, against a walk of about markEvery/2 from a mark.
const packChunk = 32 << 10

// maxPackBytes bounds a section's packed copy; past it, the section goes on from its
// marks.
const maxPackBytes = 1 << 20

// packAfter is the walks begun at a mark after which a section that packs is packed.
const packAfter = 3

// .debug_abbrev is packed once passes keep walking it from its marks (packAfter walks:
// a file whose passes keep meeting new units): one walk from the start keeps each chunk
// of its output compressed with S2, and later needs decode the chunks they reach from
// there instead of walking the stream from a mark; its marks go. A unit needs a few
// hundred bytes of it, scattered, and its abbreviations repeat from unit to unit: the
// C library's 960 KB pack into 255 KB, where its four marks hold 13 KB (its deflate
// blocks are long, so a walk from a mark averaged over 100 KB). Where processes come
// and go, each new C library unit walked it from a mark as well as .debug_info and
// .debug_line; packed, one of the three walks goes. .debug_line packs into half its
// size (the C library's 1.3 MB into 720 KB, for its 17 marks' 106 KB): not worth its
// memory beside the CPU its walks cost.

// lazySection is a compressed section decompressed where decoding needs it.
type lazySection struct {
	packed  []byte
	comp    compression
	size    uint64
	release func([]byte) // gives back the compressed pages read; may be nil
	region  *mmapfile.Region
	filled  bitset // blocks written to region
	pinned  bitset // blocks Thin keeps: the units a pass asked for, until it ends
	all     bool   // every block is filled as the stream passes it

	stream   io.Reader
	closer   func()
	pos      uint64 // bytes the stream has produced
	walks    int    // walks from the start since the last thin
	discard  []byte
	inflated uint64 // bytes decompressed in all, for the statistics
	thinned  uint64 // inflated at the last thin
	nFilled  int    // blocks filled
	held     int64  // their bytes and the marks'
	low      uint64 // no block below it is filled but pinned ones
	marks    []blockMark

	pack      bool             // packed once walked from marks packAfter times
	marked    int              // walks begun at a mark
	packWhole bool             // the walk under way reads to the end, packing each chunk
	packMem   *mmapfile.Region // the copies, one after another, reserved up to maxPackBytes
	packUsed  int
	chunks    []packedChunk // by chunk; n 0: not packed
	nPacked   int
	asm       []byte  // the chunk the stream is passing, as far as it got
	asmBuf    *[]byte // asm's memory, from chunkScratch
	asmAt     uint64  // where asm begins in the output; asm is nil when none is under way
}

type packedChunk struct{ off, n uint32 }

// blockMark is where a zlib stream can be entered again: the bit its block begins at,
// the output before it, and the last window bytes of that output, compressed with S2
// and kept in anonymous memory as the decompressed copies are, outside the Go heap.
type blockMark struct {
	bit, out uint64
	packed   []byte // the history, S2
	histLen  int
	region   *mmapfile.Region
}

// history decompresses the mark's history into dst, which has room for a window.
func (m *blockMark) history(dst []byte) ([]byte, error) {
	if m.histLen > len(dst) {
		return nil, fmt.Errorf("mark at %d: history of %d bytes", m.out, m.histLen)
	}
	h, err := s2.Decode(dst[:m.histLen], m.packed)
	if err != nil || len(h) != m.histLen {
		return nil, fmt.Errorf("mark at %d: history does not decode", m.out)
	}
	return h, nil
}

// markScratch holds the room a mark's history is compressed in before it is copied to
// memory of its own size, and decompressed in before an inflater takes it.
var markScratch = sync.Pool{New: func() any { b := make([]byte, s2.MaxEncodedLen(window)); return &b }}

type bitset []uint64

func (b bitset) has(i uint64) bool { return i/64 < uint64(len(b)) && b[i/64]&(1<<(i%64)) != 0 }
func (b bitset) set(i uint64)      { b[i/64] |= 1 << (i % 64) }
func (b bitset) clear(i uint64)    { b[i/64] &^= 1 << (i % 64) }

func newLazy(packed []byte, comp compression, size uint64, release func([]byte), pack bool) *lazySection {
	n := (size + lazyBlock - 1) / lazyBlock
	l := &lazySection{packed: packed, comp: comp, size: size, release: release,
		filled: make(bitset, (n+63)/64), pinned: make(bitset, (n+63)/64)}
	if pack && size > 0 {
		l.pack = true
		l.chunks = make([]packedChunk, (size+packChunk-1)/packChunk)
	}
	return l
}

// bytes returns the section's region, reserving it on first use: blocks not filled
// read as zeros, which every reader of these sections bounds-checks like any input.
func (l *lazySection) bytes() ([]byte, error) {
	if l.region == nil {
		if l.size > math.MaxInt {
			return nil, fmt.Errorf("size %d", l.size)
		}
		r, err := mmapfile.Anon(int(l.size))
		if err != nil {
			return nil, err
		}
		l.region = r
	}
	b := l.region.Bytes()
	if b == nil {
		b = []byte{}
	}
	return b, nil
}

// need fills the blocks under [off, end). It returns the bytes it newly holds.
func (l *lazySection) need(off, end uint64) (int64, error) {
	end = min(end, l.size)
	if off >= end {
		return 0, nil
	}
	if _, err := l.bytes(); err != nil {
		return 0, err
	}
	first, last := off/lazyBlock, (end-1)/lazyBlock
	if l.all {
		last = (l.size - 1) / lazyBlock // one walk fills the section
	}
	before := l.held
	if l.nPacked > 0 {
		if err := l.unpack(first, last); err != nil {
			return 0, err
		}
	}
	for first <= last && l.filled.has(first) {
		first++
	}
	for last >= first && l.filled.has(last) {
		last--
	}
	if first > last {
		return l.held - before, nil
	}
	if first*lazyBlock < l.pos || l.stream == nil || !l.all && l.jump(first*lazyBlock) {
		// A hostile file's references back and forth cost a few decompressions of the
		// section, not one walk each.
		if l.inflated-l.thinned > maxWalks*l.size {
			l.all = true
		}
		from := first * lazyBlock
		if l.all {
			last, from = (l.size-1)/lazyBlock, 0
		}
		packWhole := l.pack && l.packUsed == 0 && l.marked >= packAfter
		if packWhole {
			from = 0
		}
		if err := l.restart(from); err != nil {
			return 0, err
		}
		l.packWhole = packWhole
		if l.pos == 0 {
			if l.walks++; l.walks > maxWalks && !l.all {
				l.all = true
				last = (l.size - 1) / lazyBlock
			}
		}
	}
	for (l.pos <= last*lazyBlock || l.packWhole) && l.pos < l.size {
		blk := l.pos / lazyBlock
		n := min(lazyBlock, l.size-l.pos)
		keep := !l.filled.has(blk) && (l.all || blk >= first && blk <= last)
		packing := l.packing()
		var got int
		var err error
		switch sk, ok := l.stream.(*inflater); {
		case keep:
			got, err = io.ReadFull(l.stream, l.region.Bytes()[l.pos:l.pos+n])
			if packing {
				l.asm = append(l.asm, l.region.Bytes()[l.pos:l.pos+uint64(got)]...)
			}
		case packing:
			got, err = io.ReadFull(l.stream, l.asm[len(l.asm):len(l.asm)+int(n)])
			l.asm = l.asm[:len(l.asm)+got]
		case ok:
			got, err = sk.skip(int(n))
		default:
			if l.discard == nil {
				l.discard = make([]byte, lazyBlock)
			}
			got, err = io.ReadFull(l.stream, l.discard[:n])
		}
		l.inflated += uint64(got)
		if err != nil {
			l.closeStream()
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				err = fmt.Errorf("%d of %d bytes", l.pos+uint64(got), l.size)
			}
			return l.held - before, err
		}
		if keep {
			l.filled.set(blk)
			l.nFilled++
			l.held += int64(n)
			l.low = min(l.low, blk)
		}
		l.pos += n
		if packing {
			l.finishChunk()
		}
	}
	if l.pos >= l.size || l.nPacked == len(l.chunks) && l.pack {
		l.closeStream() // nothing more to read: what stays is in the region, or packed
	}
	return l.held - before, nil
}

// packing says whether the block at pos goes into a chunk being packed, starting one
// where a chunk begins that is not packed and the bound leaves room for.
func (l *lazySection) packing() bool {
	if !l.packWhole {
		return false
	}
	if l.asm != nil {
		return l.asmAt+uint64(len(l.asm)) == l.pos
	}
	c := l.pos / packChunk
	if l.packUsed+s2.MaxEncodedLen(packChunk) > maxPackBytes {
		l.packWhole = false // the rest goes on from the marks
		return false
	}
	if l.pos%packChunk != 0 || l.chunks[c].n != 0 {
		return false
	}
	l.asmBuf = chunkScratch.Get().(*[]byte)
	l.asm, l.asmAt = (*l.asmBuf)[:0], l.pos
	return true
}

// finishChunk packs the chunk under way once the stream has passed it whole.
func (l *lazySection) finishChunk() {
	c := l.asmAt / packChunk
	if uint64(len(l.asm)) < min(packChunk, l.size-l.asmAt) {
		return
	}
	defer l.endChunk()
	if l.packMem == nil {
		r, err := mmapfile.Anon(maxPackBytes)
		if err != nil {
			return // not packed: walks go on from the marks
		}
		l.packMem = r
	}
	// packing left room for the chunk's largest encoding: it lands where it is put.
	enc := s2.EncodeBetter(l.packMem.Bytes()[l.packUsed:], l.asm)
	l.chunks[c] = packedChunk{off: uint32(l.packUsed), n: uint32(len(enc))}
	l.packUsed += len(enc)
	l.held += int64(len(enc))
	if l.nPacked++; l.nPacked == len(l.chunks) {
		// Every need is met from the copies: the marks serve nothing.
		l.dropMarks()
	}
}

// endChunk gives up the chunk under way, packed or not.
func (l *lazySection) endChunk() {
	if l.asmBuf != nil {
		chunkScratch.Put(l.asmBuf)
		l.asm, l.asmBuf = nil, nil
	}
}

// unpack fills the blocks from first to last that are not filled and lie in packed
// chunks, decoding each chunk once.
func (l *lazySection) unpack(first, last uint64) error {
	var buf *[]byte
	defer func() {
		if buf != nil {
			chunkScratch.Put(buf)
		}
	}()
	for c := first * lazyBlock / packChunk; c <= last*lazyBlock/packChunk && c < uint64(len(l.chunks)); c++ {
		pc := l.chunks[c]
		lo, hi := max(first, c*packChunk/lazyBlock), min(last, ((c+1)*packChunk-1)/lazyBlock)
		if pc.n == 0 || l.allFilled(lo, hi) {
			continue
		}
		if buf == nil {
			buf = chunkScratch.Get().(*[]byte)
		}
		want := int(min(packChunk, l.size-c*packChunk))
		out, err := s2.Decode((*buf)[:packChunk], l.packMem.Bytes()[pc.off:pc.off+pc.n])
		if err != nil || len(out) != want {
			return fmt.Errorf("packed chunk at %d does not decode", c*packChunk)
		}
		for b := lo; b <= hi; b++ {
			if l.filled.has(b) {
				continue
			}
			at := b*lazyBlock - c*packChunk
			n := min(lazyBlock, l.size-b*lazyBlock)
			copy(l.region.Bytes()[b*lazyBlock:b*lazyBlock+n], out[at:at+n])
			l.filled.set(b)
			l.nFilled++
			l.held += int64(n)
			l.low = min(l.low, b)
		}
	}
	return nil
}

func (l *lazySection) allFilled(first, last uint64) bool {
	for b := first; b <= last; b++ {
		if !l.filled.has(b) {
			return false
		}
	}
	return true
}

// chunkScratch holds the room a chunk is gathered in before it is packed, and
// unpacked in.
var chunkScratch = sync.Pool{New: func() any { b := make([]byte, packChunk); return &b }}

// restart opens the stream at the last mark at or before off, else at the section's
// start; pos says where.
func (l *lazySection) restart(off uint64) error {
	l.closeStream()
	if l.comp != compZlib {
		stream, closer, err := openStream(l.packed, l.comp, l.size, l.release)
		if err != nil {
			return err
		}
		l.stream, l.closer, l.pos = stream, closer, 0
		return nil
	}
	var f *inflater
	var err error
	if m := l.markBefore(off); m != nil {
		// The stream goes on from the start of the block the mark lies in, replaying
		// the end of the mark's history.
		at := m.out &^ (lazyBlock - 1)
		l.marked++
		scratch := markScratch.Get().(*[]byte)
		var hist []byte
		if hist, err = m.history(*scratch); err == nil {
			f, err = resumeInflater(l.packed, m.bit, m.out, hist, int(m.out-at), l.release)
		}
		markScratch.Put(scratch) // resumeInflater copied the history
		if err != nil {
			return err
		}
		l.pos = at
	} else {
		f, err = newInflater(l.packed, l.release)
		l.pos = 0
	}
	if err != nil {
		return err
	}
	f.onBlock = l.mark
	l.stream, l.closer = f, f.close
	return nil
}

// markBefore returns the last mark at or before off, nil when there is none.
func (l *lazySection) markBefore(off uint64) *blockMark {
	i, _ := slices.BinarySearchFunc(l.marks, off, func(m blockMark, off uint64) int { return cmp.Compare(m.out, off+1) })
	if i == 0 {
		return nil
	}
	return &l.marks[i-1]
}

// jump says whether starting again at a mark reaches off sooner than reading the open
// stream up to it.
func (l *lazySection) jump(off uint64) bool {
	m := l.markBefore(off)
	return m != nil && m.out&^(lazyBlock-1) > l.pos+2*window
}

// mark keeps where a block begins, the first past each multiple of markEvery: the
// marks do not drift by a block's length each. The history is kept once the stream is
// a window past the mark: a walk resumed there reads only the bytes the copies of that
// window reach back to (about a seventh of them in libc's debug sections) and the ones
// it replays up to the mark, so the others are kept as zeros, which S2 stores as
// nearly nothing: libc's 43 .debug_info marks at 128 KB held 263 KB instead of 857.
func (l *lazySection) mark(bit, out uint64, hist []byte) *refWatch {
	next := uint64(markEvery)
	if n := len(l.marks); n > 0 {
		next = (l.marks[n-1].out/markEvery + 1) * markEvery
	}
	if out < next || len(hist) < window || out > l.size {
		return nil
	}
	copied := markScratch.Get().(*[]byte)
	h := append((*copied)[:0], hist...)
	return &refWatch{from: out, done: func(used *[window / 64]uint64) {
		defer markScratch.Put(copied)
		if used != nil {
			// restart replays the history from the start of the page the mark lies in.
			replayed := int(out % lazyBlock)
			for i := range window - replayed {
				if used[i/64]&(1<<(i%64)) == 0 {
					h[i] = 0
				}
			}
		}
		l.keepMark(bit, out, h)
	}}
}

// keepMark keeps a mark's history compressed, in memory of its own size.
func (l *lazySection) keepMark(bit, out uint64, hist []byte) {
	if l.pack && l.nPacked == len(l.chunks) {
		return // the section is read from its packed copy, without marks
	}
	scratch := markScratch.Get().(*[]byte)
	defer markScratch.Put(scratch)
	enc := s2.EncodeBetter(*scratch, hist)
	r, err := mmapfile.Anon(len(enc))
	if err != nil {
		return // no mark: a later walk starts from an earlier one
	}
	copy(r.Bytes(), enc)
	l.marks = append(l.marks, blockMark{bit: bit, out: out, packed: r.Bytes(), histLen: len(hist), region: r})
	l.held += int64(len(enc))
}

func (l *lazySection) closeStream() {
	if l.closer != nil {
		l.closer()
	}
	l.stream, l.closer, l.discard = nil, nil, nil
	l.endChunk()
	l.packWhole = false
	// A later need starts from the start again; pos says how far this one got.
	l.pos = 0
}

// pin keeps the blocks under [off, end) through the next thin.
func (l *lazySection) pin(off, end uint64) {
	end = min(end, l.size)
	for b := off / lazyBlock; off < end && b <= (end-1)/lazyBlock; b++ {
		l.pinned.set(b)
	}
}

// forget drops the filled blocks wholly below off that are not pinned, returning the
// bytes freed: the index's walk through .debug_info keeps a window, not the section.
func (l *lazySection) forget(off uint64) int64 {
	end := min(off/lazyBlock, (l.size+lazyBlock-1)/lazyBlock)
	freed := l.dropRange(l.low, end)
	l.low = max(l.low, end)
	return freed
}

// dropRange drops the filled blocks from first up to end that are not pinned, giving
// back each run of them in one call.
func (l *lazySection) dropRange(first, end uint64) int64 {
	var freed int64
	run := uint64(0)
	flush := func(b uint64) {
		if b > run {
			l.region.Release(l.region.Bytes()[run*lazyBlock : min(b*lazyBlock, l.size)])
		}
	}
	run = first
	for b := first; b < end; b++ {
		if !l.filled.has(b) || l.pinned.has(b) {
			flush(b)
			run = b + 1
			continue
		}
		n := min(lazyBlock, l.size-b*lazyBlock)
		l.filled.clear(b)
		l.nFilled--
		l.held -= int64(n)
		freed += int64(n)
	}
	flush(end)
	return freed
}

// thin drops every filled block but the pinned ones, or all of them with unpin, and
// ends the stream: what a pass needed is decoded and cached by now.
func (l *lazySection) thin(unpin bool) int64 {
	l.closeStream()
	l.walks, l.all, l.low, l.thinned = 0, false, 0, l.inflated
	if unpin {
		clear(l.pinned)
	}
	if l.nFilled == 0 {
		return 0
	}
	return l.dropRange(0, (l.size+lazyBlock-1)/lazyBlock)
}

// markBytes is what the marks and the packed chunks hold: what stays to serve a later
// need without a walk from the start.
func (l *lazySection) markBytes() int64 {
	n := int64(l.packUsed)
	for _, m := range l.marks {
		n += int64(len(m.packed))
	}
	return n
}

// dropMarks lets go of the marks.
func (l *lazySection) dropMarks() {
	for _, m := range l.marks {
		m.region.Close()
		l.held -= int64(len(m.packed))
	}
	l.marks = nil
}

// dropKeepingMarks is drop but for the marks and the packed chunks, which stay to serve
// a later need. It returns the bytes freed.
func (l *lazySection) dropKeepingMarks() int64 {
	l.closeStream() // first: a mark the stream was making is kept
	kept := l.markBytes()
	freed := l.held - kept
	if l.region != nil {
		l.region.Close()
		l.region = nil
	}
	clear(l.filled)
	clear(l.pinned)
	l.nFilled, l.held, l.walks, l.all, l.low, l.thinned = 0, kept, 0, false, 0, l.inflated
	return freed
}

// drop lets go of the region, the stream, the marks and the packed chunks.
func (l *lazySection) drop() int64 {
	freed := l.dropKeepingMarks() + l.markBytes()
	l.dropMarks()
	if l.packMem != nil {
		l.packMem.Close()
		l.packMem = nil
	}
	clear(l.chunks)
	l.held, l.packUsed, l.nPacked = 0, 0, 0
	return freed
}
