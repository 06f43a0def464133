package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// PythonProc tells the kernel where a CPython process keeps its threads' frames and how
// to read them (types.h: struct py_proc).
type PythonProc = samplerPyProc

// Python frame models (enum py_frame_model), the way a CPython version ties its frames to
// the activations of its eval loop.
const (
	PythonModelFrameObject = uint32(samplerPyFrameModelPY_MODEL_FRAME_OBJECT) // 3.9, 3.10
	PythonModelEntryFlag   = uint32(samplerPyFrameModelPY_MODEL_ENTRY_FLAG)   // 3.11
	PythonModelShimFrame   = uint32(samplerPyFrameModelPY_MODEL_SHIM_FRAME)   // 3.12, 3.13
	// PythonNoOffset marks an offset a version does not have.
	PythonNoOffset = uint16(samplerPyLimitsPY_NO_OFFSET)
	// PythonMaxFrameRead bounds PythonProc.FrameSize.
	PythonMaxFrameRead = uint16(samplerPyLimitsPY_MAX_FRAME_READ)
)

// PythonRuntime is Python's number among the runtimes, in its frames and regions; its
// frames pack a code object's address >> PythonCodeAlignShift above the instruction's
// offset in 2-byte code units, in PythonOffsetBits (python.h, enum py_frame_encoding).
const (
	PythonRuntime        = uint8(samplerPyFrameEncodingPY_RUNTIME)
	PythonCodeAlignShift = uint(samplerPyFrameEncodingPY_CODE_ALIGN_SHIFT)
	PythonOffsetBits     = uint(samplerPyFrameEncodingPY_OFFSET_BITS)
)

// PythonEnd says how the walk of a thread's Python frames ended (enum py_end).
type PythonEnd uint32

const (
	PythonComplete  = PythonEnd(samplerPyEndPY_COMPLETE)
	PythonNoThread  = PythonEnd(samplerPyEndPY_NO_THREAD)
	PythonBadRead   = PythonEnd(samplerPyEndPY_BAD_READ)
	PythonTruncated = PythonEnd(samplerPyEndPY_TRUNCATED)
	PythonInvalid   = PythonEnd(samplerPyEndPY_INVALID)
	PythonEndCount  = int(samplerPyEndPY_END_MAX)
)

func (e PythonEnd) String() string {
	switch e {
	case PythonComplete:
		return "complete"
	case PythonNoThread:
		return "no_thread"
	case PythonBadRead:
		return "bad_read"
	case PythonTruncated:
		return "truncated"
	case PythonInvalid:
		return "invalid"
	default:
		return "unknown"
	}
}

// pythonThreads sizes the kernel's cache of thread states by thread id: an LRU, so a host
// with more Python threads than this searches a thread list now and then.
const pythonThreads = 16384

func init() {
	kernelRuntimes = append(kernelRuntimes, kernelRuntime{size: func(spec *ebpf.CollectionSpec, maxProcs uint32) {
		spec.Maps["py_procs"].MaxEntries = maxProcs
		spec.Maps["py_threads"].MaxEntries = pythonThreads
	}})
}

// SetPython tells the kernel a process runs CPython, as of its exec p.ExecId: its samples
// in the eval loop get the Python frames of the sampled thread.
func (s *Sampler) SetPython(pid uint32, p *PythonProc) error {
	if err := s.objs.PyProcs.Put(pid, p); err != nil {
		return fmt.Errorf("set python state of pid %d: %w", pid, err)
	}
	eval := []Region{{p.EvalStart, p.EvalEnd}, {p.ColdStart, p.ColdEnd}}
	if err := s.setRegions(pid, p.ExecId, PythonRuntime, eval); err != nil {
		s.objs.PyProcs.Delete(pid)
		return fmt.Errorf("set python state: %w", err)
	}
	return nil
}

// DeletePython forgets a process's interpreter.
func (s *Sampler) DeletePython(pid uint32) error {
	var p PythonProc
	if err := s.objs.PyProcs.Lookup(pid, &p); err == nil {
		if err := s.setRegions(pid, p.ExecId, PythonRuntime, nil); err != nil {
			return fmt.Errorf("delete python state: %w", err)
		}
	}
	if err := s.objs.PyProcs.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete python state of pid %d: %w", pid, err)
	}
	return nil
}

// PythonEnds counts the kernel's walks of Python frames by how they ended, summed over
// CPUs and indexed by PythonEnd.
func (s *Sampler) PythonEnds() ([PythonEndCount]uint64, error) {
	var out [PythonEndCount]uint64
	for i := range out {
		v, err := perCPUSum(s.objs.PyCounters, uint32(i))
		if err != nil {
			return out, fmt.Errorf("read python counter %d: %w", i, err)
		}
		out[i] = v
	}
	return out, nil
}
