package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// V8Proc tells the kernel where a V8 process keeps its code and how its frames are laid
// out (v8.h: struct v8_proc).
type V8Proc = samplerV8Proc

// V8Runtime is V8's number among the runtimes; its frames' 58 bits hold a kind in bits
// 57-56: V8KindJIT, a pc (bits 46-0) and whether it is a return address (bit 47);
// V8KindBytecode, a SharedFunctionInfo's address >> V8SFIShift above a bytecode offset in
// V8OffsetBits; V8KindBytecodeArray, the same with a BytecodeArray's address (v8.h, enum
// v8_frame_encoding).
const (
	V8Runtime           = uint8(samplerV8FrameEncodingV8RUNTIME)
	V8KindShift         = uint(samplerV8FrameEncodingV8KIND_SHIFT)
	V8KindJIT           = uint64(samplerV8FrameEncodingV8KIND_JIT)
	V8KindBytecode      = uint64(samplerV8FrameEncodingV8KIND_BYTECODE)
	V8KindBytecodeArray = uint64(samplerV8FrameEncodingV8KIND_BYTECODE_ARRAY)
	V8ReturnBit         = uint(samplerV8FrameEncodingV8RETURN_BIT)
	V8SFIShift          = uint(samplerV8FrameEncodingV8SFI_SHIFT)
	V8OffsetBits        = uint(samplerV8FrameEncodingV8OFFSET_BITS)
)

// V8End says how a walk of V8 frames ended (enum v8_end).
type V8End uint32

const (
	V8Complete  = V8End(samplerV8EndV8COMPLETE)
	V8BadRead   = V8End(samplerV8EndV8BAD_READ)
	V8Truncated = V8End(samplerV8EndV8TRUNCATED)
	V8EndCount  = int(samplerV8EndV8END_MAX)
)

func (e V8End) String() string {
	switch e {
	case V8Complete:
		return "complete"
	case V8BadRead:
		return "bad_read"
	case V8Truncated:
		return "truncated"
	default:
		return "unknown"
	}
}

// v8Functions sizes the kernel's record of the functions that ran code (compiled code's
// pcs, interpreted frames' BytecodeArrays): an LRU (about 100 bytes an entry), read by
// user space within moments of the samples that wrote it.
const v8Functions = 32768

func init() {
	kernelRuntimes = append(kernelRuntimes, kernelRuntime{size: func(spec *ebpf.CollectionSpec, maxProcs uint32) {
		spec.Maps["v8_procs"].MaxEntries = maxProcs
		spec.Maps["v8_functions"].MaxEntries = v8Functions
	}})
}

// V8Function returns the SharedFunctionInfo (tagged) the kernel last found in a frame
// running code at code (a pc of compiled code, or a tagged BytecodeArray), if it still has
// it.
func (s *Sampler) V8Function(pid uint32, code uint64) (uint64, bool) {
	var sfi uint64
	if err := s.objs.V8Functions.Lookup(samplerV8CodeKey{Pid: pid, Code: code}, &sfi); err != nil {
		return 0, false
	}
	return sfi, true
}

// SetV8 tells the kernel a process runs V8, as of its exec p.ExecId: its samples in V8's
// code get V8's frames.
func (s *Sampler) SetV8(pid uint32, p *V8Proc) error {
	if err := s.objs.V8Procs.Put(pid, p); err != nil {
		return fmt.Errorf("set v8 state of pid %d: %w", pid, err)
	}
	code := []Region{{p.BuiltinsStart, p.BuiltinsEnd}, {p.RemapStart, p.RemapEnd}, {p.JitStart, p.JitEnd}}
	if err := s.setRegions(pid, p.ExecId, V8Runtime, code); err != nil {
		s.objs.V8Procs.Delete(pid)
		return fmt.Errorf("set v8 state: %w", err)
	}
	return nil
}

// DeleteV8 forgets a process's V8.
func (s *Sampler) DeleteV8(pid uint32) error {
	var p V8Proc
	if err := s.objs.V8Procs.Lookup(pid, &p); err == nil {
		if err := s.setRegions(pid, p.ExecId, V8Runtime, nil); err != nil {
			return fmt.Errorf("delete v8 state: %w", err)
		}
	}
	if err := s.objs.V8Procs.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete v8 state of pid %d: %w", pid, err)
	}
	return nil
}

// V8Ends counts the kernel's walks of V8 frames by how they ended, summed over CPUs and
// indexed by V8End.
func (s *Sampler) V8Ends() ([V8EndCount]uint64, error) {
	var out [V8EndCount]uint64
	for i := range out {
		v, err := perCPUSum(s.objs.V8Counters, uint32(i))
		if err != nil {
			return out, fmt.Errorf("read v8 counter %d: %w", i, err)
		}
		out[i] = v
	}
	return out, nil
}
