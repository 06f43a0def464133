package php

import (
	"log/slog"
	"strings"

	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/trace"
)

// KernelState is what the kernel needs to walk a process's PHP frames: the kernel's struct
// php_proc (bpf/php.h), field for field, which the writer checks before the runtime starts.
type KernelState struct {
	ExecID             uint64
	Current            uint64 // &executor_globals.current_execute_data
	ExecStart, ExecEnd uint64 // execute_ex
	ColdStart, ColdEnd uint64 // its out-of-line part, or 0, 0
	JitStart, JitEnd   uint64 // opcache's JIT buffer, or 0, 0
	ExOpline, ExFunc   uint16
	ExCallInfo, ExPrev uint16
	FuncType, FuncName uint16
	OpArrayFilename    uint16
	OpLineno           uint16
	JitCFA, JitFP      uint16 // execute_ex's frame in its body: CFA - sp or rbp, CFA - where rbp is
	JitFromFP          uint16 // 1: JitCFA is from rbp
	_                  uint16
}

// KernelStateFor places an engine's facts at its load bias for the exec execID.
func KernelStateFor(e *Engine, bias, execID uint64) *KernelState {
	l := e.Layout
	s := &KernelState{
		ExecID:          execID,
		Current:         e.Globals + uint64(l.CurrentExecuteData) + bias,
		ExecStart:       e.Exec[0] + bias,
		ExecEnd:         e.Exec[1] + bias,
		ExOpline:        uint16(l.ExOpline),
		ExFunc:          uint16(l.ExFunc),
		ExCallInfo:      uint16(l.ExCallInfo),
		ExPrev:          uint16(l.ExPrev),
		FuncType:        uint16(l.FuncType),
		FuncName:        uint16(l.FuncName),
		OpArrayFilename: uint16(l.OpArrayFilename),
		OpLineno:        uint16(l.OpLineno),
		JitCFA:          uint16(e.Frame.CFA),
		JitFP:           uint16(e.Frame.FP),
	}
	if e.ExecCold[1] != 0 {
		s.ColdStart, s.ColdEnd = e.ExecCold[0]+bias, e.ExecCold[1]+bias
	}
	if e.Frame.FromFP {
		s.JitFromFP = 1
	}
	return s
}

// regions are the engine's executor loop in a process, whose activations on the native
// stack the kernel replaces by PHP frames.
func (s *KernelState) regions() []interp.Region {
	return []interp.Region{{Start: s.ExecStart, End: s.ExecEnd}, {Start: s.ColdStart, End: s.ColdEnd}, {Start: s.JitStart, End: s.JitEnd}}
}

// jitBuffer finds opcache's JIT buffer among a process's executable mappings: the part of
// its shared memory it made executable, a shared anonymous mapping ("/dev/zero (deleted)"),
// or System V or POSIX shared memory where opcache is configured to use those.
func jitBuffer(mappings []*trace.Mapping) (start, end uint64) {
	for _, m := range mappings {
		p := m.Path
		if p == "/dev/zero (deleted)" || p == "/dev/zero" || strings.HasPrefix(p, "/SYSV") || strings.HasPrefix(p, "/dev/shm/") {
			return m.Start, m.End
		}
	}
	return 0, 0
}

// TrackerConfig configures a Tracker.
type TrackerConfig struct {
	Kernel interp.Kernel
	// MaxFiles bounds the files whose verdict is remembered; 0 means interp.DefaultMaxFiles.
	MaxFiles int
	// OnError hears once per file why an engine in it cannot be walked.
	OnError func(path string, err error)
}

// TrackerStats counts what a Tracker did.
type TrackerStats struct {
	FilesInspected int    // files looked at, PHP or not
	Engines        int    // of which Zend engines sonde can walk
	Unsupported    int    // of which engines it cannot (version, build)
	Processes      int    // processes running PHP now
	KernelErrors   uint64 // writes to the kernel that failed
}

func (s TrackerStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Int("files_inspected", s.FilesInspected), slog.Int("engines", s.Engines),
		slog.Int("unsupported", s.Unsupported), slog.Int("processes", s.Processes), slog.Uint64("kernel_errors", s.KernelErrors))
}

// Tracker finds the Zend engine among each process's mappings and tells the kernel how to
// walk it; it implements trace.MappingObserver, on the process tracker's goroutine.
type Tracker struct {
	files *interp.Files[Engine]
	procs *interp.Procs[Image]
}

// NewTracker returns a Tracker writing to cfg.Kernel.
func NewTracker(cfg TrackerConfig) *Tracker {
	return &Tracker{files: interp.NewFiles(cfg.MaxFiles, Inspect, ErrNotPHP, cfg.OnError), procs: interp.NewProcs[Image](cfg.Kernel)}
}

// ProcessMappings looks for an engine among a process's executable mappings.
func (t *Tracker) ProcessMappings(pid uint32, execID uint64, mappings []*trace.Mapping) {
	for _, m := range mappings {
		if m.File == nil || m.File.IsGo {
			continue
		}
		e := t.files.Get(m.File)
		if e == nil {
			continue
		}
		bias, ok := e.Bias(m.Start, m.Offset)
		if !ok {
			continue
		}
		state := KernelStateFor(e, bias, execID)
		if state.JitCFA != 0 {
			state.JitStart, state.JitEnd = jitBuffer(mappings)
		}
		changed := t.procs.Update(pid, func(old *Image) *Image {
			if old != nil && old.bias == bias && old.execID == execID && old.jit == [2]uint64{state.JitStart, state.JitEnd} {
				return nil // told already
			}
			return &Image{Version: e.Version, Layout: e.Layout, bias: bias, execID: execID, jit: [2]uint64{state.JitStart, state.JitEnd}}
		})
		if changed {
			t.procs.Tell(pid, execID, state, state.regions())
		}
		return
	}
	t.procs.Forget(pid)
}

// ProcessGone forgets a process.
func (t *Tracker) ProcessGone(pid uint32) { t.procs.Forget(pid) }

// Image returns the engine a process runs, as mapped there, or nil.
func (t *Tracker) Image(pid uint32) *Image { return t.procs.Image(pid) }

// Stats returns the counts so far.
func (t *Tracker) Stats() TrackerStats {
	fs := t.files.Stats()
	procs, kernelErrors := t.procs.Counts()
	return TrackerStats{FilesInspected: fs.Inspected, Engines: fs.Found, Unsupported: fs.Unsupported,
		Processes: procs, KernelErrors: kernelErrors}
}
