package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// JVMProc tells the kernel where a HotSpot process keeps its code and how its frames
// and code blobs are laid out (jvm.h: struct jvm_proc).
type JVMProc = samplerJvmProc

// JVMHeap is one code heap of a JVMProc: its span of the code cache and segment map.
type JVMHeap = samplerJvmHeap

// JVMRuntime is HotSpot's number among the runtimes; its frames' 58 bits hold a kind in
// bit JVMKindBit: JVMKindCode, a pc (bits 46-0), whether it is a return address (bit
// JVMReturnBit) and the low 8 bits of its blob's compile id (from JVMTagShift);
// JVMKindInterpreted, a Method* >> JVMMethodShift above a bci in JVMBCIBits,
// JVMBCIUnknown where the bci is not known (jvm.h, enum jvm_frame_encoding).
const (
	JVMRuntime         = uint8(samplerJvmFrameEncodingJVM_RUNTIME)
	JVMKindBit         = uint(samplerJvmFrameEncodingJVM_KIND_BIT)
	JVMKindCode        = uint64(samplerJvmFrameEncodingJVM_KIND_CODE)
	JVMKindInterpreted = uint64(samplerJvmFrameEncodingJVM_KIND_INTERPRETED)
	JVMReturnBit       = uint(samplerJvmFrameEncodingJVM_RETURN_BIT)
	JVMTagShift        = uint(samplerJvmFrameEncodingJVM_TAG_SHIFT)
	JVMMethodShift     = uint(samplerJvmFrameEncodingJVM_METHOD_SHIFT)
	JVMBCIBits         = uint(samplerJvmFrameEncodingJVM_BCI_BITS)
	JVMBCIUnknown      = uint64(samplerJvmFrameEncodingJVM_BCI_UNKNOWN)
)

// What the kernel's walker reads at most (enum jvm_limits): SetJVM refuses a layout
// beyond it.
const (
	JVMMaxHeaps   = int(samplerJvmLimitsJVM_MAX_HEAPS)
	JVMSlotsBelow = int(samplerJvmLimitsJVM_SLOTS_BELOW)
	JVMBlobRead   = int(samplerJvmLimitsJVM_BLOB_READ)
)

// JVMEnd says how a walk of Java frames ended (enum jvm_end).
type JVMEnd uint32

const (
	JVMComplete  = JVMEnd(samplerJvmEndJVM_COMPLETE)
	JVMNoHeap    = JVMEnd(samplerJvmEndJVM_NO_HEAP)
	JVMNoBlob    = JVMEnd(samplerJvmEndJVM_NO_BLOB)
	JVMBadRead   = JVMEnd(samplerJvmEndJVM_BAD_READ)
	JVMBadFrame  = JVMEnd(samplerJvmEndJVM_BAD_FRAME)
	JVMTruncated = JVMEnd(samplerJvmEndJVM_TRUNCATED)
	JVMEndCount  = int(samplerJvmEndJVM_END_MAX)
)

func (e JVMEnd) String() string {
	switch e {
	case JVMComplete:
		return "complete"
	case JVMNoHeap:
		return "no_heap"
	case JVMNoBlob:
		return "no_blob"
	case JVMBadRead:
		return "bad_read"
	case JVMBadFrame:
		return "bad_frame"
	case JVMTruncated:
		return "truncated"
	default:
		return "unknown"
	}
}

func init() {
	kernelRuntimes = append(kernelRuntimes, kernelRuntime{size: func(spec *ebpf.CollectionSpec, maxProcs uint32) {
		spec.Maps["jvm_procs"].MaxEntries = maxProcs
	}})
}

// checkJVM tells whether the kernel's walker can read what p says, within its bounds.
func checkJVM(p *JVMProc) error {
	if p.HeapCount == 0 || int(p.HeapCount) > JVMMaxHeaps {
		return fmt.Errorf("%d code heaps: the walker reads 1 to %d", p.HeapCount, JVMMaxHeaps)
	}
	if p.CodeHigh <= p.CodeLow || p.InterpStart < p.CodeLow || p.InterpEnd > p.CodeHigh {
		return fmt.Errorf("code cache [%#x, %#x), interpreter [%#x, %#x): implausible", p.CodeLow, p.CodeHigh, p.InterpStart, p.InterpEnd)
	}
	for _, slot := range []int16{p.FpMethod, p.FpBcp, p.FpSenderSp} {
		if int(slot) < -JVMSlotsBelow || slot > -8 || slot%8 != 0 {
			return fmt.Errorf("interpreter frame slot at fp%+d: the walker reads fp-%d to fp-8", slot, JVMSlotsBelow)
		}
	}
	words := []struct {
		off  uint16
		size uint16
	}{{p.BlobSize, 4}, {p.BlobFrameSize, 4}, {p.BlobFrameComplete, 4}, {p.NmethodCompileId, 4}, {p.BlobCodeBegin, 4}}
	if p.CodeBeginIsPointer != 0 {
		words[len(words)-1].size = 8
	}
	if int(p.BlobRead) > JVMBlobRead {
		return fmt.Errorf("%d bytes of a code blob to read: the walker reads at most %d", p.BlobRead, JVMBlobRead)
	}
	for _, w := range words {
		if int(w.off)+int(w.size) > int(p.BlobRead) {
			return fmt.Errorf("code blob field at %d: past the %d bytes the walker reads of a blob", w.off, p.BlobRead)
		}
	}
	return nil
}

// SetJVM tells the kernel a process runs HotSpot, as of its exec p.ExecId: its samples
// that reach the code cache get Java frames.
func (s *Sampler) SetJVM(pid uint32, p *JVMProc) error {
	if err := checkJVM(p); err != nil {
		return fmt.Errorf("set jvm state of pid %d: %w", pid, err)
	}
	if err := s.objs.JvmProcs.Put(pid, p); err != nil {
		return fmt.Errorf("set jvm state of pid %d: %w", pid, err)
	}
	return nil
}

// DeleteJVM forgets a process's JVM.
func (s *Sampler) DeleteJVM(pid uint32) error {
	if err := s.objs.JvmProcs.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete jvm state of pid %d: %w", pid, err)
	}
	return nil
}

// JVMEnds counts the kernel's walks of Java frames by how they ended, summed over CPUs
// and indexed by JVMEnd.
func (s *Sampler) JVMEnds() ([JVMEndCount]uint64, error) {
	var out [JVMEndCount]uint64
	for i := range out {
		v, err := perCPUSum(s.objs.JvmCounters, uint32(i))
		if err != nil {
			return out, fmt.Errorf("read jvm counter %d: %w", i, err)
		}
		out[i] = v
	}
	return out, nil
}
