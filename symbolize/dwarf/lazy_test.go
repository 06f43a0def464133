package dwarf

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"testing"

	stdzlib "compress/zlib"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zlib"
)

// lazySize is what t's sections decompressed a block at a time inflate to.
func lazySize(t *Table) int64 { return packedSize(t) - wholeSize(t) }

// Decompressing .debug_info, .debug_abbrev and .debug_line only where decoding reaches
// names every address as decompressing them whole does, and holds a small part of them:
// the index keeps the units of the addresses announced, Prepare fetches a pass's new
// units in one walk through each section, and Thin lets them go once decoded.
func TestLazySectionsMatchWhole(t *testing.T) {
	path, ef := openLibcDebug(t)
	whole, err := Load(ef, Options{}) // read by debug/elf, decompressed whole
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	// Addresses in units all over the file: each unit's first span, and one inside.
	var addrs []uint64
	seen := map[uint32]bool{}
	for _, sp := range whole.spans {
		if !seen[sp.unit] && len(addrs) < 600 {
			seen[sp.unit] = true
			addrs = append(addrs, sp.lo, sp.lo+(sp.hi-sp.lo)/2)
		}
	}
	if len(seen) < 100 {
		t.Fatalf("%d units indexed: not the file this test needs", len(seen))
	}

	m := mapFile(t, path)
	c := NewCache(64 << 20)
	first, prepared, rest := addrs[:20], addrs[20:300], addrs[300:]
	lazy, err := Load(ef, Options{File: m.Bytes(), Release: m.Release, Cache: c, Want: first})
	if err != nil {
		t.Fatal(err)
	}
	defer lazy.Close()
	big := lazySize(lazy)
	if big < 4*lazyBlock {
		t.Fatalf("%d bytes decompressed a block at a time: not the file this test needs", big)
	}
	st := c.Decompressed()
	t.Logf("load: %+v; %d bytes decompressed a block at a time, %d whole", st, big, wholeSize(lazy))
	if st.PeakBytes > big/3+wholeSize(lazy) {
		t.Errorf("building the index held %d bytes at once, of %d decompressed a block at a time", st.PeakBytes, big)
	}
	same := func(addrs []uint64) {
		t.Helper()
		for _, a := range addrs {
			want, _ := whole.Lookup(a)
			got, err := lazy.Lookup(a)
			if err != nil {
				t.Fatalf("%#x: %v", a, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%#x: %+v, decompressed whole %+v", a, got, want)
			}
		}
	}
	total := func() int64 { return c.Decompressed().TotalBytes }

	// The addresses announced at load decode from what the index kept.
	before := total()
	same(first)
	if d := total() - before; d != 0 {
		t.Errorf("lookups of the addresses announced at load decompressed %d bytes more", d)
	}
	lazy.Thin()
	if got := c.Decompressed().Bytes; got != wholeSize(lazy)+lazy.MarkBytes() {
		t.Errorf("%d bytes held after Thin, want the %d of the sections decompressed whole and the %d of the marks",
			got, wholeSize(lazy), lazy.MarkBytes())
	}
	// A window of 32 KB every markEvery, and one more a section at most.
	if lazy.MarkBytes() > big*window/markEvery+3*window {
		t.Errorf("marks of %d bytes for %d decompressed a block at a time", lazy.MarkBytes(), big)
	}

	// A pass's new units: one walk through each section, at most.
	before = total()
	if err := lazy.Prepare(prepared); err != nil {
		t.Fatal(err)
	}
	walked := total() - before
	same(prepared)
	if d := total() - before; d != walked || walked > big {
		t.Errorf("Prepare decompressed %d bytes and its lookups %d more; one walk is at most %d", walked, d-walked, big)
	}
	t.Logf("prepare: walked %d, held %d", walked, c.Decompressed().Bytes-wholeSize(lazy))
	if held := c.Decompressed().Bytes - wholeSize(lazy); held > big/2 {
		t.Errorf("%d bytes held for %d addresses, of %d", held, len(prepared), big)
	}
	lazy.Thin()

	// The last unit of the file, after the walks above left their marks: each section
	// is entered at the mark before what it needs, not read from its start.
	var late uint64
	lateUnit := -1
	for _, sp := range whole.spans {
		if !seen[sp.unit] && int(sp.unit) > lateUnit {
			late, lateUnit = sp.lo, int(sp.unit)
		}
	}
	before = total()
	same([]uint64{late})
	// Three sections, each entered at most markEvery before what it needs, and the
	// unit's own bytes.
	const fromMarks = 3*markEvery + markEvery
	if d := total() - before; d > fromMarks || d == 0 {
		t.Errorf("the last unit decompressed %d bytes; from the marks, at most %d", d, fromMarks)
	}
	t.Logf("last unit: %d", total()-before)

	// Lookups nobody announced, in units all over the file: decoding goes back and forth,
	// and a few walks in, the sections fill whole.
	before = total()
	same(rest)
	t.Logf("rest: %d", total()-before)
	if d := total() - before; d > int64(maxWalks+1)*big {
		t.Errorf("lookups decompressed %d bytes: more than %d walks of %d", d, maxWalks+1, big)
	}
	marks := lazy.MarkBytes()
	t.Logf("marks: %d bytes", marks)
	if marks == 0 || marks > maxKeptMarks {
		t.Fatalf("marks of %d bytes: not the file this test needs", marks)
	}
	lazy.Trim()
	if got := c.Decompressed().Bytes; got != marks {
		t.Errorf("%d bytes held after Trim, want the %d of the marks", got, marks)
	}
	// After Trim, everything decodes again from the sections, and the last unit from
	// the mark before it rather than from the start.
	c.Shed()
	before = total()
	same([]uint64{late})
	// The sections decompressed whole come back whole.
	if d := total() - before; d > fromMarks+wholeSize(lazy) || d == 0 {
		t.Errorf("the last unit decompressed %d bytes after Trim; from the marks kept and the small sections, at most %d", d, fromMarks+wholeSize(lazy))
	}
	t.Logf("last unit after Trim: %d", total()-before)
	same(addrs[:40])
	lazy.Thin()
	if got := c.Decompressed().Bytes; got != wholeSize(lazy)+marks {
		t.Errorf("%d bytes held after Thin, want the %d of the sections decompressed whole and the %d of the marks",
			got, wholeSize(lazy), marks)
	}
	// The bound's need for room takes the marks too.
	lazy.mu.Lock()
	lazy.dropScratch()
	lazy.mu.Unlock()
	if got := c.Decompressed().Bytes; got != 0 || lazy.MarkBytes() != 0 {
		t.Errorf("%d bytes held and %d of marks after the copies were dropped", got, lazy.MarkBytes())
	}
}

// A section decompressed a block at a time holds what was asked for and what is
// pinned, walks again only for a block behind its stream, fills itself whole after
// maxWalks walks, and reads back what decompressing it whole gives.
func TestLazySectionBlocks(t *testing.T) {
	plain := make([]byte, 40*lazyBlock+123)
	for i := range plain {
		plain[i] = byte(i*7 + i/lazyBlock)
	}
	l, b := zlibLazy(t, plain)
	need := func(off, end uint64) {
		t.Helper()
		if _, err := l.need(off, end); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b[off:min(end, uint64(len(plain)))], plain[off:min(end, uint64(len(plain)))]) {
			t.Fatalf("[%d, %d) differs from the section decompressed whole", off, end)
		}
	}
	need(5*lazyBlock+10, 7*lazyBlock)  // blocks 5 and 6
	need(20*lazyBlock, 20*lazyBlock+1) // forward: the same walk
	need(40*lazyBlock, 41*lazyBlock)   // the short last block
	if l.walks != 1 || l.nFilled != 4 || l.held-l.markBytes() != 3*lazyBlock+123 {
		t.Fatalf("after three forward needs: %d walks, %d blocks, %d bytes held", l.walks, l.nFilled, l.held)
	}
	need(5*lazyBlock, 6*lazyBlock) // filled already: no walk
	if l.walks != 1 {
		t.Fatalf("a filled block walked again: %d walks", l.walks)
	}
	l.pin(20*lazyBlock, 21*lazyBlock)
	if freed := l.forget(30 * lazyBlock); freed != 2*lazyBlock || l.filled.has(5) || !l.filled.has(20) {
		t.Fatalf("forget below block 30 freed %d bytes: blocks 5 and 6 go, pinned 20 stays", freed)
	}
	need(2*lazyBlock, 3*lazyBlock) // behind the stream: a second walk
	need(1*lazyBlock, 2*lazyBlock) // a third
	if l.walks != 3 || l.all {
		t.Fatalf("%d walks, whole %v", l.walks, l.all)
	}
	need(0, 1) // the fourth walk fills the section
	if !l.all || l.nFilled != 41 || !bytes.Equal(b, plain) {
		t.Fatalf("after %d walks: whole %v, %d of 41 blocks", l.walks, l.all, l.nFilled)
	}
	if freed := l.thin(true); freed != int64(len(plain)) || l.held != l.markBytes() || l.walks != 0 {
		t.Fatalf("thin freed %d of %d bytes, %d held, %d walks", freed, len(plain), l.held, l.walks)
	}
}

// A zlib section leaves marks as it is walked: a later need behind the stream starts at
// the mark before it, a need far ahead jumps to a mark, and what either reads is the
// section's own bytes.
func TestLazySectionMarks(t *testing.T) {
	plain := make([]byte, 3*markEvery+markEvery/2)
	rng := uint32(1)
	for i := range plain {
		rng = rng*1664525 + 1013904223
		plain[i] = byte(rng>>28) + byte(i/lazyBlock) // compresses, in many blocks
	}
	// The standard library's deflate ends a block every 16 Ki tokens: a mark lies
	// shortly past each multiple of markEvery.
	l, b := zlibLazyWith(t, plain, func(w io.Writer) io.WriteCloser { return stdzlib.NewWriter(w) })
	need := func(off uint64) uint64 {
		t.Helper()
		before := l.inflated
		if _, err := l.need(off, off+100); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b[off:off+100], plain[off:off+100]) {
			t.Fatalf("[%d, %d) differs from the section decompressed whole", off, off+100)
		}
		return l.inflated - before
	}
	need(uint64(len(plain)) - 200) // the first walk, from the start: a mark every markEvery
	if len(l.marks) != 3 {
		t.Fatalf("%d marks after a walk through %d bytes", len(l.marks), len(plain))
	}
	l.thin(true)
	if d := need(markEvery + markEvery/2); d > markEvery/2+2*lazyBlock {
		t.Errorf("a need behind the stream decompressed %d bytes: not from the mark before it", d)
	}
	if d := need(3*markEvery + markEvery/4); d > markEvery/4+2*lazyBlock {
		t.Errorf("a need far ahead decompressed %d bytes: it did not jump to the mark", d)
	}
	if l.walks != 0 {
		t.Errorf("%d walks from the start, with marks before every need", l.walks)
	}
	l.thin(true)
	need(0) // before the first mark: a walk from the start
	l.all = true
	need(3*markEvery + markEvery/4) // filling whole reads on, never jumps
	if blocks := (len(plain) + lazyBlock - 1) / lazyBlock; l.walks != 1 || l.nFilled != blocks {
		t.Errorf("filling whole: %d walks, %d of %d blocks", l.walks, l.nFilled, blocks)
	}
	if held := l.markBytes(); held == 0 || l.held < held {
		t.Errorf("%d bytes held, the marks alone are %d", l.held, held)
	}
}

// A section that packs, walked from its marks packAfter times, is packed by the next
// walk: from then on its needs are met from the packed chunks, with the section's own
// bytes, and no more decompression; its marks go, and the chunks stay as the marks did
// when the blocks go.
func TestLazySectionPacks(t *testing.T) {
	plain := dwarfLikeText(6*markEvery + 1000)
	l, b := zlibLazyPacking(t, plain)
	rng := rand.New(rand.NewPCG(7, 8))
	need := func(off, end uint64) {
		t.Helper()
		end = min(end, uint64(len(plain)))
		if _, err := l.need(off, end); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b[off:end], plain[off:end]) {
			t.Fatalf("[%d, %d) differs from the section decompressed whole", off, end)
		}
	}
	need(uint64(len(plain))-10, uint64(len(plain))) // the first walk leaves the marks
	l.thin(true)
	for l.marked < packAfter {
		off := markEvery + rng.Uint64N(uint64(len(plain))-markEvery)
		need(off, off+300)
		l.thin(true)
		if l.nPacked != 0 {
			t.Fatalf("packed after %d walks from marks", l.marked)
		}
	}
	need(markEvery+5, markEvery+20)
	if l.nPacked != len(l.chunks) || len(l.marks) != 0 || l.held != l.markBytes()+lazyBlock {
		t.Fatalf("after %d walks from marks: %d of %d chunks packed, %d marks, %d bytes held", l.marked, l.nPacked, len(l.chunks), len(l.marks), l.held)
	}
	if l.packUsed == 0 || l.packUsed > len(plain)/2 {
		t.Fatalf("%d bytes packed for %d of text", l.packUsed, len(plain))
	}
	inflated := l.inflated
	for range 200 {
		l.thin(true)
		off := rng.Uint64N(uint64(len(plain)))
		need(off, off+1+rng.Uint64N(3*lazyBlock))
	}
	if l.inflated != inflated || l.stream != nil {
		t.Errorf("needs after packing decompressed %d bytes", l.inflated-inflated)
	}
	packed := int64(l.packUsed)
	if freed := l.dropKeepingMarks(); freed <= 0 || l.held != packed || l.markBytes() != packed {
		t.Errorf("the blocks dropped (%d bytes): %d held, want the %d packed", freed, l.held, packed)
	}
	need(0, uint64(len(plain)))
	if l.inflated != inflated {
		t.Errorf("the whole section after the blocks went decompressed %d bytes", l.inflated-inflated)
	}
	if freed := l.drop(); freed != packed+int64(len(plain)) || l.held != 0 || l.packMem != nil || l.nPacked != 0 {
		t.Errorf("drop freed %d bytes of %d, %d held", freed, packed+int64(len(plain)), l.held)
	}
}

// A section whose packed copy would pass maxPackBytes packs up to it and goes on from
// its marks past it, reading its own bytes either way.
func TestLazySectionPackBound(t *testing.T) {
	plain := make([]byte, maxPackBytes+maxPackBytes/2) // noise: S2 keeps it as is
	rng := rand.New(rand.NewPCG(9, 10))
	for i := range plain {
		plain[i] = byte(rng.Uint32())
	}
	l, b := zlibLazyPacking(t, plain)
	l.marked = packAfter
	if _, err := l.need(10, 20); err != nil {
		t.Fatal(err)
	}
	if l.nPacked == 0 || l.nPacked == len(l.chunks) || l.packUsed > maxPackBytes || len(l.marks) == 0 {
		t.Fatalf("%d of %d chunks packed in %d bytes, %d marks", l.nPacked, len(l.chunks), l.packUsed, len(l.marks))
	}
	l.thin(true)
	for _, off := range []uint64{0, maxPackBytes / 2, maxPackBytes - 100, maxPackBytes + 5000, uint64(len(plain)) - 50} {
		end := min(off+2*lazyBlock, uint64(len(plain)))
		if _, err := l.need(off, end); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b[off:end], plain[off:end]) {
			t.Fatalf("[%d, %d) differs from the section decompressed whole", off, end)
		}
	}
}

// dwarfLikeText is n bytes that compress as DWARF does, in many deflate blocks.
func dwarfLikeText(n int) []byte {
	rng := rand.New(rand.NewPCG(11, 12))
	text := make([]byte, 0, n+64)
	for len(text) < n {
		text = fmt.Appendf(text, "DW_TAG_subprogram %d name_%x %d ", rng.IntN(50), rng.IntN(4096), len(text)/lazyBlock)
	}
	return text[:n]
}

// zlibLazyPacking is zlibLazy for a section that packs.
func zlibLazyPacking(t *testing.T, plain []byte) (*lazySection, []byte) {
	t.Helper()
	var zb bytes.Buffer
	zw := stdzlib.NewWriter(&zb)
	zw.Write(plain)
	zw.Close()
	return lazyOf(t, newLazy(zb.Bytes(), compZlib, uint64(len(plain)), nil, true))
}

// openLibcDebug opens the C library's debug file, closed when the test ends.
func openLibcDebug(t testing.TB) (string, *elf.File) {
	t.Helper()
	path := buildIDDebugFile(t, libcPath(t))
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ef.Close() })
	return path, ef
}

// zlibLazy is plain compressed with zlib as a section decompressed a block at a time, and
// the region its blocks are filled into.
func zlibLazy(t *testing.T, plain []byte) (*lazySection, []byte) {
	t.Helper()
	return zlibLazyWith(t, plain, func(w io.Writer) io.WriteCloser { return zlib.NewWriter(w) })
}

// zlibLazyWith is zlibLazy with another zlib writer.
func zlibLazyWith(t *testing.T, plain []byte, writer func(io.Writer) io.WriteCloser) (*lazySection, []byte) {
	t.Helper()
	var zb bytes.Buffer
	zw := writer(&zb)
	zw.Write(plain)
	zw.Close()
	return lazyOf(t, newLazy(zb.Bytes(), compZlib, uint64(len(plain)), nil, false))
}

// lazyOf is l and its region, dropped when the test ends.
func lazyOf(t *testing.T, l *lazySection) (*lazySection, []byte) {
	t.Helper()
	t.Cleanup(func() { l.drop() })
	b, err := l.bytes()
	if err != nil {
		t.Fatal(err)
	}
	return l, b
}

// A mark keeps of its history only what a walk resumed there reads: the bytes the next
// window's copies reach back to, and the end of its page that the walk replays. With
// the whole history kept (the mark's watch ignored), the marks hold more than half
// what S2 makes of their windows.
func TestLazySectionMarksKeepWhatIsCopied(t *testing.T) {
	plain := dwarfLikeText(1<<20 + 1000)
	l, _ := zlibLazy(t, plain)
	if _, err := l.need(0, uint64(len(plain))); err != nil {
		t.Fatal(err)
	}
	if len(l.marks) < 4 {
		t.Fatalf("%d marks in %d bytes", len(l.marks), len(plain))
	}
	whole := 0
	for _, m := range l.marks {
		whole += len(s2.EncodeBetter(nil, plain[m.out-window:m.out]))
	}
	if kept := l.markBytes(); kept*2 > int64(whole) {
		t.Errorf("the marks hold %d bytes, their whole windows %d", kept, whole)
	}
	t.Logf("%d marks hold %d bytes, their whole windows %d", len(l.marks), l.markBytes(), whole)
	for i := range l.marks {
		m := l.marks[i]
		// Straight from the mark: the end of its page replayed, then what follows.
		if err := l.restart(m.out); err != nil {
			t.Fatal(err)
		}
		at := m.out &^ (lazyBlock - 1)
		got := make([]byte, min(m.out-at+2*window, uint64(len(plain))-at))
		if _, err := io.ReadFull(l.stream, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, plain[at:at+uint64(len(got))]) {
			i := 0
			for got[i] == plain[at+uint64(i)] {
				i++
			}
			t.Fatalf("the walk resumed at the mark at %d reads other bytes from %d (%q, not %q)", m.out, at+uint64(i), got[i:i+8], plain[at+uint64(i):at+uint64(i)+8])
		}
		// Through need, after the section's blocks went.
		l.dropKeepingMarks()
		off := m.out + lazyBlock
		end := min(off+3*lazyBlock, uint64(len(plain)))
		if off >= end {
			continue
		}
		if _, err := l.need(off, end); err != nil {
			t.Fatal(err)
		}
		if b, _ := l.bytes(); !bytes.Equal(b[off:end], plain[off:end]) {
			t.Fatalf("[%d, %d) differs from the section decompressed whole", off, end)
		}
	}
}
