package jvm

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// CodeHeap is one heap of the code cache: its committed memory and segment map.
type CodeHeap struct {
	Low, High       uint64 // committed code memory [Low, High)
	SegmapLow       uint64
	SegmapHigh      uint64
	Log2SegmentSize uint8
}

// maxCodeHeaps bounds the heaps read: HotSpot has at most three (non-nmethods,
// profiled and non-profiled nmethods), or one without segmentation.
const maxCodeHeaps = 8

// CodeHeaps reads the code cache's heaps (CodeCache::_heaps) as they are now: their
// committed memory grows as the JVM compiles.
func (p *Process) CodeHeaps() ([]CodeHeap, error) {
	l := p.Layout
	arr, err := readU64(p.m, l.CodeCacheHeaps)
	if err != nil {
		return nil, fmt.Errorf("read CodeCache::_heaps: %w", err)
	}
	if arr == 0 {
		return nil, fmt.Errorf("no code heaps' array: %w", ErrNotReady)
	}
	ga, err := p.record(arr, l.GrowableArrayLen, l.GrowableArrayData)
	if err != nil {
		return nil, fmt.Errorf("read the code heaps' array: %w", err)
	}
	n := ga.i(l.GrowableArrayLen)
	if n == 0 {
		// The array is made when libjvm is loaded, its heaps added as the VM starts.
		return nil, fmt.Errorf("no code heaps: %w", ErrNotReady)
	}
	if n < 0 || n > maxCodeHeaps {
		return nil, fmt.Errorf("%d code heaps: implausible", n)
	}
	ptrs, err := p.read(ga.u(l.GrowableArrayData), uint64(n)*8)
	if err != nil {
		return nil, fmt.Errorf("read the code heaps' pointers: %w", err)
	}
	vsLow := l.VirtualSpaceLow
	vsHigh := l.VirtualSpaceHigh
	mem := func(base Member) (Member, Member) {
		return Member{Offset: base.Offset + vsLow.Offset, Size: 8}, Member{Offset: base.Offset + vsHigh.Offset, Size: 8}
	}
	memLow, memHigh := mem(l.CodeHeapMemory)
	segLow, segHigh := mem(l.CodeHeapSegmap)
	var heaps []CodeHeap
	for i := range int(n) {
		h, err := p.record(binary.LittleEndian.Uint64(ptrs[i*8:]), memLow, memHigh, segLow, segHigh, l.CodeHeapLog2SegmentSize)
		if err != nil {
			return nil, fmt.Errorf("read code heap %d: %w", i, err)
		}
		ch := CodeHeap{Low: h.u(memLow), High: h.u(memHigh), SegmapLow: h.u(segLow), SegmapHigh: h.u(segHigh),
			Log2SegmentSize: uint8(h.u(l.CodeHeapLog2SegmentSize))}
		if ch.Log2SegmentSize < 4 || ch.Log2SegmentSize > 16 || ch.High < ch.Low || ch.SegmapHigh < ch.SegmapLow ||
			(ch.High-ch.Low)>>ch.Log2SegmentSize > ch.SegmapHigh-ch.SegmapLow {
			return nil, fmt.Errorf("code heap %d: memory [%#x, %#x), segment map [%#x, %#x), segments of 2^%d bytes: implausible",
				i, ch.Low, ch.High, ch.SegmapLow, ch.SegmapHigh, ch.Log2SegmentSize)
		}
		heaps = append(heaps, ch)
	}
	p.mu.Lock()
	p.heaps = heaps
	p.mu.Unlock()
	return heaps, nil
}

// Bounds returns the code cache's reserved range (CodeCache::_low_bound, _high_bound):
// every pc of compiled or generated code lies in it.
func (p *Process) Bounds() (low, high uint64, err error) {
	if low, err = readU64(p.m, p.Layout.CodeCacheLowBound); err != nil {
		return 0, 0, err
	}
	if high, err = readU64(p.m, p.Layout.CodeCacheHighBound); err != nil {
		return 0, 0, err
	}
	if low == 0 && high == 0 {
		return 0, 0, fmt.Errorf("no code cache: %w", ErrNotReady)
	}
	if high <= low {
		return 0, 0, fmt.Errorf("code cache [%#x, %#x): empty", low, high)
	}
	return low, high, nil
}

// Interpreter returns the range of the template interpreter's code: a pc in it belongs
// to an interpreted frame, whose frame pointer leads to its Method* and bcp
// (Layout.Frame).
func (p *Process) Interpreter() (start, end uint64, err error) {
	l := p.Layout
	q, err := readU64(p.m, l.InterpreterCode)
	if err != nil {
		return 0, 0, fmt.Errorf("read AbstractInterpreter::_code: %w", err)
	}
	if q == 0 {
		return 0, 0, fmt.Errorf("no interpreter: %w", ErrNotReady)
	}
	r, err := p.record(q, l.StubQueueBuffer, l.StubQueueLimit)
	if err != nil {
		return 0, 0, fmt.Errorf("read the interpreter's StubQueue: %w", err)
	}
	start = r.u(l.StubQueueBuffer)
	limit := r.i(l.StubQueueLimit)
	if start == 0 || limit <= 0 || limit > maxBlobSize {
		return 0, 0, fmt.Errorf("interpreter code at %#x of %d bytes: implausible", start, limit)
	}
	return start, start + uint64(limit), nil
}

// Blob is a code blob: compiled code (an nmethod) or code HotSpot generated itself (the
// interpreter, stubs, adapters).
type Blob struct {
	Addr, End uint64 // the blob, header included: [Addr, End)
	CodeBegin uint64 // its instructions: [CodeBegin, CodeEnd)
	CodeEnd   uint64
	Name      string
	FrameSize int32 // words
	NMethod   bool
	// Of an nmethod.
	Method    uint64 // Method*
	CompileID int32
	CompLevel int32
	EntryBCI  int32 // InvocationEntryBci for a method's entry, else an OSR's bci

	rec record
}

var (
	errNotInHeap = errors.New("pc outside the code heaps")
	errFreeBlock = errors.New("pc in free code cache memory")
	errNotABlob  = errors.New("no code blob there")
)

// maxBlobSize bounds a blob: HotSpot's largest nmethods are a few MiB.
const maxBlobSize = 64 << 20

func (p *Process) blobMembers() []Member {
	l := p.Layout
	ms := []Member{l.BlobName, l.BlobSize, l.BlobHeaderSize, l.BlobFrameSize, l.BlobDataOffset, l.BlobCodeBegin,
		l.NMethodMethod, l.NMethodCompileID, l.NMethodCompLevel, l.NMethodEntryBCI, l.NMethodScopesPcsOffset}
	if l.HasBlobKind {
		ms = append(ms, l.BlobKind)
	}
	if l.NMethodImmutable {
		ms = append(ms, l.NMethodImmutableData, l.NMethodImmutableDataSize, l.NMethodScopesDataOffset,
			l.BlobMutableData, l.BlobMutableDataSize, l.BlobRelocationSize)
	} else {
		ms = append(ms, l.NMethodScopesDataBegin, l.NMethodDependenciesOffset, l.NMethodMetadataOffset)
	}
	return ms
}

// ReadBlob reads the code blob at addr, checking that it holds together: its size, its
// instructions within it.
func (p *Process) ReadBlob(addr uint64) (*Blob, error) {
	l := p.Layout
	// The nmethod's fields are read with the blob's: a smaller blob is followed by
	// other code cache memory, read needlessly but harmlessly, unless the read crosses
	// the end of the heap's mapping; then the blob's own fields are read alone.
	r, err := p.record(addr, p.blobMembers()...)
	if err != nil {
		if r, err = p.record(addr, l.BlobName, l.BlobSize, l.BlobHeaderSize, l.BlobFrameSize, l.BlobDataOffset, l.BlobCodeBegin); err != nil {
			return nil, fmt.Errorf("read code blob at %#x: %w", addr, err)
		}
	}
	b := &Blob{Addr: addr, rec: r}
	size := r.i(l.BlobSize)
	if size <= 0 || size > maxBlobSize {
		return nil, fmt.Errorf("code blob at %#x of %d bytes: %w", addr, size, errNotABlob)
	}
	b.End = addr + uint64(size)
	if l.CodeBeginIsPointer {
		b.CodeBegin = r.u(l.BlobCodeBegin)
	} else {
		b.CodeBegin = addr + uint64(r.i(l.BlobCodeBegin))
	}
	b.CodeEnd = addr + uint64(r.i(l.BlobDataOffset))
	if b.CodeBegin < addr || b.CodeEnd > b.End || b.CodeBegin > b.CodeEnd {
		return nil, fmt.Errorf("code blob at %#x: code [%#x, %#x) outside it: %w", addr, b.CodeBegin, b.CodeEnd, errNotABlob)
	}
	b.FrameSize = int32(r.i(l.BlobFrameSize))
	if b.Name, err = readCString(p.m, r.u(l.BlobName), maxCString); err != nil {
		return nil, fmt.Errorf("read name of code blob at %#x: %w", addr, err)
	}
	if l.HasBlobKind {
		b.NMethod = int64(r.u(l.BlobKind)) == l.KindNMethod
	} else {
		// Without CodeBlob::_kind (JDK 17) an nmethod is told by the name its
		// constructor gives every one; its Method is checked when read.
		b.NMethod = b.Name == "nmethod" || b.Name == "native nmethod"
	}
	if b.NMethod {
		if uint64(len(r)) < span(p.blobMembers()...) || span(p.blobMembers()...) > uint64(size) {
			return nil, fmt.Errorf("nmethod at %#x of %d bytes: smaller than its header", addr, size)
		}
		b.Method = r.u(l.NMethodMethod)
		b.CompileID = int32(r.i(l.NMethodCompileID))
		b.CompLevel = int32(r.i(l.NMethodCompLevel))
		b.EntryBCI = int32(r.i(l.NMethodEntryBCI))
	}
	return b, nil
}

// maxSegmapSteps bounds the hops back through a segment map: each moves at least one
// segment, so a heap of at most 2^24 segments (1 GiB of 64-byte ones) needs no more.
const maxSegmapSteps = 1 << 24

// BlobAt finds the code blob holding pc as the JVM does (CodeHeap::find_start): the
// segment map holds, for each segment of the heap, how many segments back the block
// holding it starts (in hops of at most 254), or 0xFF where the segment is free.
func (p *Process) BlobAt(pc uint64) (*Blob, error) {
	p.mu.Lock()
	heaps := p.heaps
	p.mu.Unlock()
	h, ok := heapOf(heaps, pc)
	if !ok {
		// The heaps grow: read them again before deciding.
		var err error
		if heaps, err = p.CodeHeaps(); err != nil {
			return nil, err
		}
		if h, ok = heapOf(heaps, pc); !ok {
			return nil, errNotInHeap
		}
	}
	seg := (pc - h.Low) >> h.Log2SegmentSize
	const chunk = 4096
	var buf []byte
	var lo uint64
	for steps := 0; ; steps++ {
		if steps > maxSegmapSteps {
			return nil, fmt.Errorf("segment map of heap at %#x loops", h.Low)
		}
		if buf == nil || seg < lo {
			lo = seg - min(seg, chunk-1)
			var err error
			if buf, err = p.read(h.SegmapLow+lo, seg-lo+1); err != nil {
				return nil, fmt.Errorf("read segment map: %w", err)
			}
		}
		hop := uint64(buf[seg-lo])
		if hop == 0xFF {
			return nil, errFreeBlock
		}
		if hop == 0 {
			break
		}
		if hop > seg {
			return nil, fmt.Errorf("segment map hops before its heap at segment %d", seg)
		}
		seg -= hop
	}
	block := h.Low + seg<<h.Log2SegmentSize
	l := p.Layout
	hb, err := p.record(block, l.HeapBlockLength, l.HeapBlockUsed)
	if err != nil {
		return nil, fmt.Errorf("read heap block at %#x: %w", block, err)
	}
	if hb.u(l.HeapBlockUsed) == 0 {
		return nil, errFreeBlock
	}
	blockEnd := block + hb.u(l.HeapBlockLength)<<h.Log2SegmentSize
	b, err := p.ReadBlob(block + l.HeapBlockSize)
	if err != nil {
		return nil, err
	}
	if pc < b.Addr || pc >= b.End || b.End > blockEnd {
		return nil, fmt.Errorf("pc %#x outside the blob [%#x, %#x) of its block: %w", pc, b.Addr, b.End, errNotABlob)
	}
	return b, nil
}

func heapOf(heaps []CodeHeap, pc uint64) (CodeHeap, bool) {
	for _, h := range heaps {
		if h.Low <= pc && pc < h.High {
			return h, true
		}
	}
	return CodeHeap{}, false
}

// Blobs calls fn with every code blob in the code cache, walking each heap's blocks as
// their headers chain them, until fn returns false. Blobs that cannot be read are
// counted in the result's second value, not passed.
func (p *Process) Blobs(fn func(*Blob) bool) (skipped int, err error) {
	heaps, err := p.CodeHeaps()
	if err != nil {
		return 0, err
	}
	l := p.Layout
	for _, h := range heaps {
		// The heap's memory past its last block is committed but not yet carved into
		// blocks: the segment map marks it free (0xFF) from where it starts, as it marks
		// free blocks merged away; a block's first segment is 0 in it.
		segs := (h.High - h.Low) >> h.Log2SegmentSize
		segmap, err := p.read(h.SegmapLow, segs)
		if err != nil {
			return skipped, fmt.Errorf("read segment map of heap at %#x: %w", h.Low, err)
		}
		for seg := uint64(0); seg < segs; {
			if segmap[seg] != 0 {
				break
			}
			addr := h.Low + seg<<h.Log2SegmentSize
			hb, err := p.record(addr, l.HeapBlockLength, l.HeapBlockUsed)
			if err != nil {
				return skipped, fmt.Errorf("read heap block at %#x: %w", addr, err)
			}
			length := hb.u(l.HeapBlockLength)
			if length == 0 || length > segs-seg {
				// A block being carved out as it is read: the rest of the heap cannot be
				// walked now.
				return skipped, fmt.Errorf("heap block at %#x of %d segments: implausible", addr, length)
			}
			if hb.u(l.HeapBlockUsed) != 0 {
				b, err := p.ReadBlob(addr + l.HeapBlockSize)
				if err != nil {
					skipped++
				} else if !fn(b) {
					return skipped, nil
				}
			}
			seg += length
		}
	}
	return skipped, nil
}
