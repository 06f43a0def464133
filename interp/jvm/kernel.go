package jvm

import (
	"fmt"
	"math"
	"reflect"
	"slices"
)

// KernelState is what a kernel walker of a process's JVM frames needs, read from the
// process's own tables: where its code is, which code is the interpreter's, where an
// interpreted frame keeps its Method* and bcp, and how to get from a pc in the code
// cache to its nmethod and the nmethod's Method* and compile id. Offsets are in bytes.
type KernelState struct {
	ExecID      uint64    // the exec of the process the state is for
	CodeCache   [2]uint64 // the code cache's reserved [low, high): every pc of the JVM's code
	Interpreter [2]uint64 // the template interpreter's code
	// Interpreter frame slots from the frame pointer (x86_64: negative).
	FPMethod, FPBCP, FPLocals, FPSenderSP int16
	// An interpreter frame's bci is its bcp less the ConstMethod's address and size: the
	// bytecodes follow it.
	MethodConstMethod uint16
	ConstMethodSize   uint16

	// The code heaps, their segment maps and the blocks' header: a pc's blob is found
	// by walking the segment map back (CodeHeap::find_start).
	Heaps         []CodeHeap
	HeapBlockSize uint16
	// Code blobs: the blob's size and frame size (in words), where its code begins (a
	// pointer or an offset from the blob), where its frame is set up (an offset from its
	// code: a pc before it is in the prologue), its kind where the build says it.
	BlobSize, BlobFrameSize, BlobCodeBegin, BlobFrameComplete uint16
	// FrameComplete16 says _frame_complete_offset is 16 bits wide (JDK 25), not 32; the
	// other fields a walker reads are 32 bits wide, or a pointer where CodeBeginIsPointer.
	FrameComplete16    bool
	CodeBeginIsPointer bool
	BlobKind           uint16 // meaningful when HasBlobKind
	HasBlobKind        bool
	KindNMethod        uint8
	// nmethods: the Method* and compile id that name it and tell one compilation at an
	// address from a later one.
	NMethodMethod, NMethodCompileID uint16
}

// KernelState reads what a kernel walker needs of the process now: the heaps grow, so a
// tracker reads it again when the process's mappings change.
func (p *Process) KernelState() (*KernelState, error) {
	l := p.Layout
	low, high, err := p.Bounds()
	if err != nil {
		return nil, err
	}
	istart, iend, err := p.Interpreter()
	if err != nil {
		return nil, err
	}
	heaps, err := p.CodeHeaps()
	if err != nil {
		return nil, err
	}
	s := &KernelState{
		CodeCache: [2]uint64{low, high}, Interpreter: [2]uint64{istart, iend}, Heaps: heaps,
		CodeBeginIsPointer: l.CodeBeginIsPointer, HasBlobKind: l.HasBlobKind, KindNMethod: uint8(l.KindNMethod),
	}
	fr := l.Frame
	words := []struct {
		dst *int16
		w   int32
	}{{&s.FPMethod, fr.Method}, {&s.FPBCP, fr.BCP}, {&s.FPLocals, fr.Locals}, {&s.FPSenderSP, fr.SenderSP}}
	for _, x := range words {
		if x.w < -64 || x.w > 64 {
			return nil, fmt.Errorf("interpreter frame slot %d words from the frame pointer: past what a walker reads", x.w)
		}
		*x.dst = int16(x.w * 8)
	}
	offs := []struct {
		dst *uint16
		v   uint64
	}{{&s.MethodConstMethod, l.MethodConstMethod.Offset}, {&s.ConstMethodSize, l.ConstMethodSize},
		{&s.HeapBlockSize, l.HeapBlockSize}, {&s.BlobSize, l.BlobSize.Offset}, {&s.BlobFrameSize, l.BlobFrameSize.Offset},
		{&s.BlobCodeBegin, l.BlobCodeBegin.Offset}, {&s.BlobFrameComplete, l.BlobFrameComplete.Offset}, {&s.BlobKind, l.BlobKind.Offset},
		{&s.NMethodMethod, l.NMethodMethod.Offset}, {&s.NMethodCompileID, l.NMethodCompileID.Offset}}
	for _, o := range offs {
		if o.v > math.MaxUint16 {
			return nil, fmt.Errorf("offset %d: past what a walker reads", o.v)
		}
		*o.dst = uint16(o.v)
	}
	widths := []struct {
		name string
		m    Member
		want []uint8
	}{{"CodeBlob::_size", l.BlobSize, []uint8{4}}, {"CodeBlob::_frame_size", l.BlobFrameSize, []uint8{4}},
		{"CodeBlob::_frame_complete_offset", l.BlobFrameComplete, []uint8{2, 4}},
		{"nmethod::_compile_id", l.NMethodCompileID, []uint8{4}}, {"CodeBlob's code begin", l.BlobCodeBegin, []uint8{4}}}
	if l.CodeBeginIsPointer {
		widths[len(widths)-1].want = []uint8{8}
	}
	for _, w := range widths {
		if !slices.Contains(w.want, w.m.Size) {
			return nil, fmt.Errorf("%s is %d bytes wide: a walker reads %v", w.name, w.m.Size, w.want)
		}
	}
	s.FrameComplete16 = l.BlobFrameComplete.Size == 2
	if low > istart || iend > high {
		return nil, fmt.Errorf("interpreter [%#x, %#x) outside the code cache [%#x, %#x)", istart, iend, low, high)
	}
	return s, nil
}

// HeapSpans returns each heap's span of the code cache, [Low, the next heap's Low or the
// code cache's high bound), in the order of Heaps: a heap commits memory up to its span's
// end as the JVM compiles, and its segment map with it, so a walker that finds a pc's heap
// by span needs no update as heaps grow.
func (s *KernelState) HeapSpans() [][2]uint64 {
	spans := make([][2]uint64, len(s.Heaps))
	for i, h := range s.Heaps {
		end := s.CodeCache[1]
		for _, o := range s.Heaps {
			if o.Low > h.Low && o.Low < end {
				end = o.Low
			}
		}
		spans[i] = [2]uint64{h.Low, end}
	}
	return spans
}

// equal says whether two states tell the kernel the same.
func (s *KernelState) equal(o *KernelState) bool { return reflect.DeepEqual(s, o) }

// kernelProc is the kernel's struct jvm_proc (bpf/jvm.h), field for field, which the writer
// checks before the runtime starts.
type kernelProc struct {
	ExecID                  uint64
	CodeLow, CodeHigh       uint64
	InterpStart, InterpEnd  uint64
	Heaps                   [kernelMaxHeaps]kernelHeap
	HeapCount               uint32
	FpMethod, FpBcp         int16
	FpSenderSp              int16
	MethodConstMethod       uint16
	ConstMethodSize         uint16
	HeapBlockSize           uint16
	BlobSize, BlobFrameSize uint16
	BlobCodeBegin           uint16
	BlobFrameComplete       uint16
	NmethodCompileID        uint16
	BlobRead                uint16
	CodeBeginIsPointer      uint8
	FrameComplete16         uint8
	_                       [2]uint8
}

// kernelHeap is a code heap as the kernel walks it (struct jvm_heap).
type kernelHeap struct {
	Low, End    uint64 // the heap's span of the code cache
	Segmap      uint64
	Log2Segment uint32
	_           uint32
}

// What the kernel's walker reads at most (bpf/jvm.h, enum jvm_limits): a state beyond it is
// not written.
const (
	kernelMaxHeaps   = 4
	kernelSlotsBelow = 80
	kernelBlobRead   = 512
)

// KernelValue is what the kernel's walker reads of the state (interp.KernelValuer): its
// heaps by span, and how much of a blob holds every field it takes, checked against what
// the walker reads at most.
func (s *KernelState) KernelValue() (any, error) {
	spans := s.HeapSpans()
	if len(spans) == 0 || len(spans) > kernelMaxHeaps {
		return nil, fmt.Errorf("%d code heaps: the walker reads 1 to %d", len(spans), kernelMaxHeaps)
	}
	p := &kernelProc{
		ExecID:            s.ExecID,
		CodeLow:           s.CodeCache[0],
		CodeHigh:          s.CodeCache[1],
		InterpStart:       s.Interpreter[0],
		InterpEnd:         s.Interpreter[1],
		HeapCount:         uint32(len(spans)),
		FpMethod:          s.FPMethod,
		FpBcp:             s.FPBCP,
		FpSenderSp:        s.FPSenderSP,
		MethodConstMethod: s.MethodConstMethod,
		ConstMethodSize:   s.ConstMethodSize,
		HeapBlockSize:     s.HeapBlockSize,
		BlobSize:          s.BlobSize,
		BlobFrameSize:     s.BlobFrameSize,
		BlobCodeBegin:     s.BlobCodeBegin,
		BlobFrameComplete: s.BlobFrameComplete,
		NmethodCompileID:  s.NMethodCompileID,
	}
	if s.CodeBeginIsPointer {
		p.CodeBeginIsPointer = 1
	}
	if s.FrameComplete16 {
		p.FrameComplete16 = 1
	}
	// One read of a blob covers every field the walker takes from it.
	for _, off := range []uint16{s.BlobSize, s.BlobFrameSize, s.BlobCodeBegin, s.BlobFrameComplete, s.NMethodCompileID} {
		p.BlobRead = max(p.BlobRead, off+8)
	}
	for i, sp := range spans {
		h := s.Heaps[i]
		p.Heaps[i] = kernelHeap{Low: sp[0], End: sp[1], Segmap: h.SegmapLow, Log2Segment: uint32(h.Log2SegmentSize)}
	}
	if err := p.check(); err != nil {
		return nil, err
	}
	return p, nil
}

// check tells whether the kernel's walker can read what p says, within its bounds.
func (p *kernelProc) check() error {
	if p.CodeHigh <= p.CodeLow || p.InterpStart < p.CodeLow || p.InterpEnd > p.CodeHigh {
		return fmt.Errorf("code cache [%#x, %#x), interpreter [%#x, %#x): implausible", p.CodeLow, p.CodeHigh, p.InterpStart, p.InterpEnd)
	}
	for _, slot := range []int16{p.FpMethod, p.FpBcp, p.FpSenderSp} {
		if int(slot) < -kernelSlotsBelow || slot > -8 || slot%8 != 0 {
			return fmt.Errorf("interpreter frame slot at fp%+d: the walker reads fp-%d to fp-8", slot, kernelSlotsBelow)
		}
	}
	words := []struct {
		off  uint16
		size uint16
	}{{p.BlobSize, 4}, {p.BlobFrameSize, 4}, {p.BlobFrameComplete, 4}, {p.NmethodCompileID, 4}, {p.BlobCodeBegin, 4}}
	if p.CodeBeginIsPointer != 0 {
		words[len(words)-1].size = 8
	}
	if int(p.BlobRead) > kernelBlobRead {
		return fmt.Errorf("%d bytes of a code blob to read: the walker reads at most %d", p.BlobRead, kernelBlobRead)
	}
	for _, w := range words {
		if int(w.off)+int(w.size) > int(p.BlobRead) {
			return fmt.Errorf("code blob field at %d: past the %d bytes the walker reads of a blob", w.off, p.BlobRead)
		}
	}
	return nil
}
