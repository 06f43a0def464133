package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/interp/jvm"
	"github.com/sonde-profiler/sonde/interp/node"
	"github.com/sonde-profiler/sonde/interp/python"
	"github.com/sonde-profiler/sonde/symbolize"
	"github.com/sonde-profiler/sonde/trace"
)

// langRuntime is a language runtime on the host as the pipeline drives it; a package under
// interp/ makes one. It recognises the processes that run it among their mappings and
// tells the kernel how to walk them, decodes the frames the kernel writes and hears of
// their code, names them, runs its own reader until shutdown, and logs what it counted.
type langRuntime interface {
	trace.MappingObserver
	trace.Runtime
	symbolize.InterpNamer
	Run(ctx context.Context) error
	slog.LogValuer
}

// registeredRuntime is a runtime and the names it goes by: its number in the kernel's
// frames, and its key in the summary.
type registeredRuntime struct {
	number uint8
	name   string
	rt     langRuntime
}

// newRuntimes makes the language runtimes whose frames the kernel walks beside the native
// ones: the one place that names them. renew is the aggregator's RenewImage, which exists
// only later.
func newRuntimes(s *bpf.Sampler, renew func(pid uint32, image uint64), b budget, log *slog.Logger) []registeredRuntime {
	return []registeredRuntime{{
		number: python.Number,
		name:   "python",
		rt: python.New(python.Config{
			Kernel: kernelPython{s},
			OnError: func(path string, err error) {
				log.Info("python interpreter whose frames sonde cannot walk; its stacks show the interpreter's", "file", path, "err", err)
			},
			OnReuse: renew,
		}),
	}, {
		number: node.Number,
		name:   "v8",
		rt: node.New(node.Config{
			Kernel: kernelV8{s},
			OnError: func(path string, err error) {
				log.Info("V8 whose functions sonde cannot name: its frames are [v8], or native where it cannot walk them", "file", path, "err", err)
			},
			OnReuse:  renew,
			MaxBytes: b.v8Bytes,
		}),
	}, {
		number: jvm.Number,
		name:   "jvm",
		rt: jvm.New(jvm.Config{
			Kernel: kernelJVM{s},
			OnError: func(path string, err error) {
				log.Info("HotSpot JVM whose Java frames sonde cannot walk; its stacks show the JVM's native frames", "file", path, "err", err)
			},
			OnReuse:      renew,
			MaxBytes:     b.jvmBytes,
			MaxProcesses: b.maxProcesses,
		}),
	}}
}

// kernelPython lets package python write the sampler's py_procs map without knowing BPF.
type kernelPython struct{ s *bpf.Sampler }

func (k kernelPython) SetPython(pid uint32, st *python.KernelState) error {
	return k.s.SetPython(pid, &bpf.PythonProc{
		ExecId:         st.ExecID,
		Runtime:        st.Runtime,
		EvalStart:      st.Eval[0],
		EvalEnd:        st.Eval[1],
		ColdStart:      st.EvalCold[0],
		ColdEnd:        st.EvalCold[1],
		SkipCode:       st.SkipCode,
		Model:          st.Model,
		InterpHead:     st.InterpretersHead,
		ThreadsHead:    st.ThreadsHead,
		TstateNext:     st.ThreadNext,
		TstateThreadId: st.ThreadID,
		TstateFrame:    st.ThreadFrame,
		CframeFrame:    st.CFrameFrame,
		FramePrevious:  st.FramePrevious,
		FrameCode:      st.FrameCode,
		FrameInstr:     st.FrameInstr,
		FrameOwner:     st.FrameOwner,
		FrameIsEntry:   st.FrameIsEntry,
		FrameSize:      st.FrameSize,
		CodeAdaptive:   st.CodeAdaptive,
		LastiBytes:     st.LastiBytes,
	})
}

func (k kernelPython) DeletePython(pid uint32) error { return k.s.DeletePython(pid) }

// WalkEnds counts the kernel's walks of Python frames by how they ended.
func (k kernelPython) WalkEnds() (map[string]uint64, error) {
	ends, err := k.s.PythonEnds()
	return endsByName[bpf.PythonEnd](ends[:], err)
}

// kernelV8 lets package node write the sampler's v8_procs map without knowing BPF.
type kernelV8 struct{ s *bpf.Sampler }

func (k kernelV8) SetV8(pid uint32, st *node.KernelState) error {
	return k.s.SetV8(pid, &bpf.V8Proc{
		ExecId:              st.ExecID,
		BuiltinsStart:       st.Builtins[0],
		BuiltinsEnd:         st.Builtins[1],
		RemapStart:          st.Remapped[0],
		RemapEnd:            st.Remapped[1],
		JitStart:            st.JIT[0],
		JitEnd:              st.JIT[1],
		OffFpContext:        st.FPContext,
		OffFpFunction:       st.FPFunction,
		OffFpBytecodeOffset: st.FPBytecodeOffset,
		OffFpBytecodeArray:  st.FPBytecodeArray,
		EntryStart:          st.Entry[0],
		EntryEnd:            st.Entry[1],
		HandlersStart:       st.Handlers[0],
		HandlersEnd:         st.Handlers[1],
		FunctionShared:      st.FunctionShared,
		SmiShift:            st.SmiShift,
		TypeEntry:           st.FrameEntry,
		TypeConstructEntry:  st.FrameConstructEntry,
	})
}

func (k kernelV8) DeleteV8(pid uint32) error { return k.s.DeleteV8(pid) }

// FunctionAt is the function the kernel last found in a frame running code at code.
func (k kernelV8) FunctionAt(pid uint32, code uint64) (uint64, bool) {
	return k.s.V8Function(pid, code)
}

// WalkEnds counts the kernel's walks of V8 frames by how they ended.
func (k kernelV8) WalkEnds() (map[string]uint64, error) {
	ends, err := k.s.V8Ends()
	return endsByName[bpf.V8End](ends[:], err)
}

// kernelJVM lets package jvm write the sampler's jvm_procs map without knowing BPF.
type kernelJVM struct{ s *bpf.Sampler }

func (k kernelJVM) SetJVM(pid uint32, st *jvm.KernelState) error {
	spans := st.HeapSpans()
	if len(spans) > bpf.JVMMaxHeaps {
		return fmt.Errorf("%d code heaps: the kernel walks at most %d", len(spans), bpf.JVMMaxHeaps)
	}
	p := &bpf.JVMProc{
		ExecId:            st.ExecID,
		CodeLow:           st.CodeCache[0],
		CodeHigh:          st.CodeCache[1],
		InterpStart:       st.Interpreter[0],
		InterpEnd:         st.Interpreter[1],
		HeapCount:         uint32(len(spans)),
		FpMethod:          st.FPMethod,
		FpBcp:             st.FPBCP,
		FpSenderSp:        st.FPSenderSP,
		MethodConstMethod: st.MethodConstMethod,
		ConstMethodSize:   st.ConstMethodSize,
		HeapBlockSize:     st.HeapBlockSize,
		BlobSize:          st.BlobSize,
		BlobFrameSize:     st.BlobFrameSize,
		BlobCodeBegin:     st.BlobCodeBegin,
		BlobFrameComplete: st.BlobFrameComplete,
		NmethodCompileId:  st.NMethodCompileID,
	}
	if st.CodeBeginIsPointer {
		p.CodeBeginIsPointer = 1
	}
	if st.FrameComplete16 {
		p.FrameComplete16 = 1
	}
	// One read of a blob covers every field the walker takes from it.
	for _, off := range []uint16{st.BlobSize, st.BlobFrameSize, st.BlobCodeBegin, st.BlobFrameComplete, st.NMethodCompileID} {
		p.BlobRead = max(p.BlobRead, off+8)
	}
	for i, sp := range spans {
		h := st.Heaps[i]
		p.Heaps[i] = bpf.JVMHeap{Low: sp[0], End: sp[1], Segmap: h.SegmapLow, Log2Segment: uint32(h.Log2SegmentSize)}
	}
	return k.s.SetJVM(pid, p)
}

func (k kernelJVM) DeleteJVM(pid uint32) error { return k.s.DeleteJVM(pid) }

// WalkEnds counts the kernel's walks of Java frames by how they ended.
func (k kernelJVM) WalkEnds() (map[string]uint64, error) {
	ends, err := k.s.JVMEnds()
	return endsByName[bpf.JVMEnd](ends[:], err)
}

// endsByName keys a kernel walker's counts of how its walks ended by the ends' names.
func endsByName[E interface {
	~uint32
	String() string
}](ends []uint64, err error) (map[string]uint64, error) {
	if err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(ends))
	for i, n := range ends {
		out[E(i).String()] = n
	}
	return out, nil
}
