package main

import (
	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/interp/python"
)

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
