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
// walks were still a third of sonde's CPU beside 120 execs a second. A mark holds its
// 32 KB of history compressed (S2: 55–60 % of DWARF's bytes, decoded in tens of
// microseconds), so that twice the marks hold about what they held uncompressed
// (libc's debug file: 62 marks, 1.1 MB).
const markEvery = 128 << 10

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
}

// blockMark is where a zlib stream can be entered again: the bit its block begins at,
// the output before it, and the last window bytes of that output, compressed with S2
// and kept in anonymous memory as the decompressed copies are, outside the Go heap.
type blockMark struct {
	bit, out uint64
	packed   []byte // the history, S2
	histLen  int
	region   *mmapfile.Region
}

// history decompresses the mark's history.
func (m *blockMark) history() ([]byte, error) {
	h, err := s2.Decode(make([]byte, m.histLen), m.packed)
	if err != nil || len(h) != m.histLen {
		return nil, fmt.Errorf("mark at %d: history does not decode", m.out)
	}
	return h, nil
}

// markScratch holds the room a mark's history is compressed in before it is copied to
// memory of its own size.
var markScratch = sync.Pool{New: func() any { b := make([]byte, s2.MaxEncodedLen(window)); return &b }}

type bitset []uint64

func (b bitset) has(i uint64) bool { return i/64 < uint64(len(b)) && b[i/64]&(1<<(i%64)) != 0 }
func (b bitset) set(i uint64)      { b[i/64] |= 1 << (i % 64) }
func (b bitset) clear(i uint64)    { b[i/64] &^= 1 << (i % 64) }

func newLazy(packed []byte, comp compression, size uint64, release func([]byte)) *lazySection {
	n := (size + lazyBlock - 1) / lazyBlock
	return &lazySection{packed: packed, comp: comp, size: size, release: release,
		filled: make(bitset, (n+63)/64), pinned: make(bitset, (n+63)/64)}
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
	for first <= last && l.filled.has(first) {
		first++
	}
	for last >= first && l.filled.has(last) {
		last--
	}
	if first > last {
		return 0, nil
	}
	before := l.held
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
		if err := l.restart(from); err != nil {
			return 0, err
		}
		if l.pos == 0 {
			if l.walks++; l.walks > maxWalks && !l.all {
				l.all = true
				last = (l.size - 1) / lazyBlock
			}
		}
	}
	for l.pos <= last*lazyBlock && l.pos < l.size {
		blk := l.pos / lazyBlock
		n := min(lazyBlock, l.size-l.pos)
		var dst []byte
		keep := !l.filled.has(blk) && (l.all || blk >= first && blk <= last)
		if keep {
			dst = l.region.Bytes()[l.pos : l.pos+n]
		} else {
			if l.discard == nil {
				l.discard = make([]byte, lazyBlock)
			}
			dst = l.discard[:n]
		}
		got, err := io.ReadFull(l.stream, dst)
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
	}
	if l.pos >= l.size {
		l.closeStream() // nothing more to read: what stays is in the region
	}
	return l.held - before, nil
}

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
		var hist []byte
		if hist, err = m.history(); err != nil {
			return err
		}
		f, err = resumeInflater(l.packed, m.bit, m.out, hist, int(m.out-at), l.release)
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
// marks do not drift by a block's length each.
func (l *lazySection) mark(bit, out uint64, hist []byte) {
	next := uint64(markEvery)
	if n := len(l.marks); n > 0 {
		next = (l.marks[n-1].out/markEvery + 1) * markEvery
	}
	if out < next || len(hist) < window || out > l.size {
		return
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

// markBytes is what the marks hold.
func (l *lazySection) markBytes() int64 {
	var n int64
	for _, m := range l.marks {
		n += int64(len(m.packed))
	}
	return n
}

// dropKeepingMarks is drop but for the marks, which stay to enter the stream near
// what a later need wants. It returns the bytes freed.
func (l *lazySection) dropKeepingMarks() int64 {
	marks, kept := l.marks, l.markBytes()
	l.marks = nil
	freed := l.drop()
	l.marks, l.held = marks, kept
	return freed - kept
}

// drop lets go of the region, the stream and the marks.
func (l *lazySection) drop() int64 {
	for _, m := range l.marks {
		m.region.Close()
	}
	freed := l.held
	l.closeStream()
	if l.region != nil {
		l.region.Close()
		l.region = nil
	}
	clear(l.filled)
	clear(l.pinned)
	l.nFilled, l.held, l.walks, l.all, l.low, l.thinned = 0, 0, 0, false, 0, l.inflated
	l.marks = nil
	return freed
}
