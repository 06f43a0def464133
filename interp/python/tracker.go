package python

import (
	"fmt"
	"log/slog"

	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/trace"
)

// KernelState is what the kernel needs to walk a process's Python frames: the kernel's
// struct py_proc (bpf/python.h), field for field, which the writer checks before the
// runtime starts (bpf.CheckLayout).
type KernelState struct {
	ExecID                     uint64
	Runtime                    uint64 // &_PyRuntime
	EvalStart, EvalEnd         uint64 // _PyEval_EvalFrameDefault
	ColdStart, ColdEnd         uint64 // its .cold part, or 0, 0
	SkipCode                   uint64 // a shim's code object, whose frames are left out
	Model                      uint32 // 1: frame objects (3.9, 3.10), 2: is_entry (3.11), 3: shim frames (3.12+)
	InterpHead, ThreadsHead    uint16
	TstateNext, TstateThreadID uint16
	TstateFrame, CframeFrame   uint16
	FramePrevious, FrameCode   uint16
	FrameInstr, FrameOwner     uint16
	FrameIsEntry, FrameSize    uint16
	CodeAdaptive               uint16
	LastiBytes                 uint16 // f_lasti counts bytes (3.9)
	CodeTagBits                uint16 // tag bits of a frame's code reference (3.14+)
	FrameTLBC, CodeTLBC        uint16 // free-threaded: tlbc_index, co_tlbc; else no offset
	_                          [1]uint16
}

// Frame models of python.h (enum py_frame_model).
const (
	modelFrameObject = 1
	modelEntryFlag   = 2
	modelShimFrame   = 3
)

const kernelNoOffset = 0xffff

// maxFrameRead is PY_MAX_FRAME_READ: how much of a frame the kernel reads.
const maxFrameRead = 128

// KernelStateFor places an interpreter's facts at its load bias for the exec execID.
func KernelStateFor(in *Interpreter, bias, execID uint64) (*KernelState, error) {
	l := in.Layout
	u16 := func(off int) uint16 {
		if off < 0 {
			return kernelNoOffset
		}
		return uint16(off)
	}
	s := &KernelState{
		ExecID:         execID,
		Runtime:        in.Runtime + bias,
		EvalStart:      in.Eval[0] + bias,
		EvalEnd:        in.Eval[1] + bias,
		InterpHead:     u16(l.InterpretersHead),
		ThreadsHead:    u16(l.ThreadsHead),
		TstateNext:     u16(l.ThreadNext),
		TstateThreadID: u16(l.ThreadID),
		TstateFrame:    u16(l.ThreadFrame),
		CframeFrame:    u16(l.CFrameFrame),
		FramePrevious:  u16(l.FramePrevious),
		FrameCode:      u16(l.FrameCode),
		FrameInstr:     u16(l.FrameInstr),
		FrameOwner:     u16(l.FrameOwner),
		FrameIsEntry:   u16(l.FrameIsEntry),
		CodeAdaptive:   u16(max(l.CodeAdaptive, 0)),
		FrameTLBC:      u16(l.FrameTLBC),
		CodeTLBC:       u16(l.CodeTLBC),
	}
	if in.EvalCold[1] != 0 {
		s.ColdStart, s.ColdEnd = in.EvalCold[0]+bias, in.EvalCold[1]+bias
	}
	if in.InitShim != 0 {
		s.SkipCode = in.InitShim + bias
	}
	if in.Version.AtLeast(14) {
		// f_executable is a _PyStackRef: its low bits say how the reference is counted
		// (Py_TAG_BITS), and code objects are 16-byte aligned.
		s.CodeTagBits = 3
	}
	switch v := in.Version; {
	case v.AtLeast(12):
		s.Model = modelShimFrame
	case v.AtLeast(11):
		s.Model = modelEntryFlag
	default:
		s.Model = modelFrameObject
		s.LastiBytes = boolU16(v.Minor == 9)
	}
	size := 0
	for _, off := range []int{l.FramePrevious, l.FrameCode, l.FrameInstr} {
		size = max(size, off+8)
	}
	for _, off := range []int{l.FrameOwner, l.FrameIsEntry} {
		size = max(size, off+1)
	}
	size = max(size, l.FrameTLBC+4)
	if size > maxFrameRead {
		return nil, fmt.Errorf("python %s: frame fields end at %d, past the %d bytes the kernel reads", v(in), size, maxFrameRead)
	}
	s.FrameSize = uint16(size)
	return s, nil
}

func v(in *Interpreter) string { return in.Version.String() }

func boolU16(b bool) uint16 {
	if b {
		return 1
	}
	return 0
}

// regions are the interpreter's eval loop in a process, whose activations on the native
// stack the kernel replaces by Python frames.
func (s *KernelState) regions() []interp.Region {
	return []interp.Region{{Start: s.EvalStart, End: s.EvalEnd}, {Start: s.ColdStart, End: s.ColdEnd}}
}

// TrackerConfig configures a Tracker.
type TrackerConfig struct {
	Kernel interp.Kernel
	// MaxFiles bounds the files whose verdict is remembered; 0 means interp.DefaultMaxFiles.
	MaxFiles int
	// OnError hears once per file why an interpreter in it cannot be walked.
	OnError func(path string, err error)
}

// TrackerStats counts what a Tracker did.
type TrackerStats struct {
	FilesInspected int    // files looked at, Python or not
	Interpreters   int    // of which CPython interpreters sonde can walk
	Unsupported    int    // of which interpreters it cannot (version, build)
	Processes      int    // processes running Python now
	KernelErrors   uint64 // writes to the kernel that failed
}

func (s TrackerStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Int("files_inspected", s.FilesInspected), slog.Int("interpreters", s.Interpreters),
		slog.Int("unsupported", s.Unsupported), slog.Int("processes", s.Processes), slog.Uint64("kernel_errors", s.KernelErrors))
}

// Tracker finds the CPython interpreter among each process's mappings and tells the
// kernel how to walk it; it implements trace.MappingObserver, on the process tracker's
// goroutine. A file is inspected once, by identity, whichever processes map it.
type Tracker struct {
	files *interp.Files[Interpreter]
	procs *interp.Procs[Image]
}

// NewTracker returns a Tracker writing to cfg.Kernel.
func NewTracker(cfg TrackerConfig) *Tracker {
	return &Tracker{files: interp.NewFiles(cfg.MaxFiles, Inspect, ErrNotPython, cfg.OnError), procs: interp.NewProcs[Image](cfg.Kernel)}
}

// ProcessMappings looks for an interpreter among a process's executable mappings.
func (t *Tracker) ProcessMappings(pid uint32, execID uint64, mappings []*trace.Mapping) {
	for _, m := range mappings {
		if m.File == nil || m.File.IsGo {
			continue
		}
		in := t.files.Get(m.File)
		if in == nil {
			continue
		}
		bias, ok := in.Bias(m.Start, m.Offset)
		if !ok {
			continue
		}
		state, err := KernelStateFor(in, bias, execID)
		if err != nil {
			continue
		}
		changed := t.procs.Update(pid, func(old *Image) *Image {
			if old != nil && old.bias == bias && old.execID == execID {
				return nil // told already
			}
			if old != nil && old.execID == execID && state.SkipCode == 0 {
				state.SkipCode = old.state.SkipCode // the same interpreter's shim, met by the namer
			}
			img := NewImage(in, bias)
			img.bias, img.execID, img.state = bias, execID, *state
			return img
		})
		if changed {
			t.procs.Tell(pid, execID, state, state.regions())
		}
		return
	}
	t.procs.Forget(pid)
}

// SkipCode tells the kernel to leave out the frames of a shim code object of a process's
// interpreter: 3.13 runs one between a class's instantiation and its __init__, named
// "__init__" at line 0, where CPython's own tracebacks show nothing. Inspect finds it in
// the files sonde knows; the namer meeting one in another build calls this.
func (t *Tracker) SkipCode(pid uint32, code uint64) {
	var state KernelState
	changed := t.procs.Update(pid, func(img *Image) *Image {
		if img == nil || img.state.SkipCode == code {
			return nil
		}
		// A new image, not the one the namer reads through: Images are not changed once shared.
		next := *img
		next.state.SkipCode = code
		state = next.state
		return &next
	})
	if changed {
		t.procs.Tell(pid, state.ExecID, &state, state.regions())
	}
}

// ProcessGone forgets a process.
func (t *Tracker) ProcessGone(pid uint32) { t.procs.Forget(pid) }

// Image returns the interpreter a process runs, as mapped there, or nil.
func (t *Tracker) Image(pid uint32) *Image { return t.procs.Image(pid) }

// Stats returns the counts so far.
func (t *Tracker) Stats() TrackerStats {
	fs := t.files.Stats()
	procs, kernelErrors := t.procs.Counts()
	return TrackerStats{FilesInspected: fs.Inspected, Interpreters: fs.Found, Unsupported: fs.Unsupported,
		Processes: procs, KernelErrors: kernelErrors}
}
