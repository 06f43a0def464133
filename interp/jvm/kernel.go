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
