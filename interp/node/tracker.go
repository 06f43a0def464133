package node

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/procfs"
	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/trace"
)

// KernelState is what the kernel needs to walk a process's V8 frames: the kernel's struct
// v8_proc (bpf/v8.h), field for field, which the writer checks before the runtime starts.
type KernelState struct {
	ExecID uint64
	// [start, end) of the embedded builtins, of their copy V8 maps beside its code so that
	// calls to them are short (or zero), and of the JIT's code.
	BuiltinsStart, BuiltinsEnd uint64
	RemapStart, RemapEnd       uint64
	JitStart, JitEnd           uint64
	// The interpreter's entry trampolines and bytecode handlers, [start, end) as offsets
	// into the builtins (either copy).
	EntryStart, EntryEnd       uint32
	HandlersStart, HandlersEnd uint32
	// Frame slots from the frame pointer. OffFpBytecodeArray is 0 where the interpreter's
	// code is not known: interpreted frames are then told by their function.
	OffFpContext, OffFpFunction, OffFpBytecodeOffset, OffFpBytecodeArray int16
	FunctionShared                                                       uint16 // JSFunction: shared
	SmiShift                                                             uint8
	TypeEntry, TypeConstructEntry                                        uint8 // frame types whose caller is C++
	_                                                                    [3]uint8
}

// kernelCodeKey is the key of the kernel's v8_functions map (struct v8_code_key).
type kernelCodeKey struct {
	Pid  uint32
	_    uint32
	Code uint64
}

// kernelFunctions finds the functions the kernel last found in frames, in its
// v8_functions map.
type kernelFunctions struct{ k interp.Kernel }

func (f kernelFunctions) FunctionAt(pid uint32, code uint64) (uint64, bool) {
	var sfi uint64
	ok, err := f.k.Lookup("v8_functions", kernelCodeKey{Pid: pid, Code: code}, &sfi)
	return sfi, ok && err == nil
}

// FunctionFinder is a Kernel that remembers the function (a tagged SharedFunctionInfo) it
// last found in a frame running code at an address: a pc of compiled code, or an
// interpreted frame's (tagged) BytecodeArray. It is how frames of baseline code and
// interpreted frames are named, and what optimized code found at the pc must belong to.
type FunctionFinder interface {
	FunctionAt(pid uint32, code uint64) (uint64, bool)
}

// Image is V8 as one exec of a process maps it.
type Image struct {
	v8     *V8
	bias   uint64
	execID uint64
	state  KernelState
	isMap  atomic.Uint64 // the InstructionStream map, once found
}

func (img *Image) heap(m Memory) *heap {
	return &heap{m: m, md: &img.v8.Meta, isMap: img.isMap.Load()}
}

func (img *Image) keep(h *heap) {
	if h.isMap != 0 {
		img.isMap.Store(h.isMap)
	}
}

// TrackerConfig configures a Tracker.
type TrackerConfig struct {
	Kernel interp.Kernel
	// MaxFiles bounds the files whose verdict is remembered; 0 means interp.DefaultMaxFiles.
	MaxFiles int
	// OnError hears once per file why V8 in it cannot be walked.
	OnError func(path string, err error)
	// Maps reads /proc/PID/maps; nil reads it from /proc.
	Maps func(pid uint32) []byte
}

func (c *TrackerConfig) readMaps(pid uint32) []byte {
	if c.Maps != nil {
		return c.Maps(pid)
	}
	b, _ := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/maps")
	return b
}

// TrackerStats counts what a Tracker did.
type TrackerStats struct {
	FilesInspected int    // files looked at, V8 or not
	V8s            int    // of which V8 builds sonde walks
	Unnamed        int    // of which builds whose functions it cannot name: their frames are [v8]
	Unsupported    int    // V8 builds it cannot walk (no metadata, another frame layout)
	Processes      int    // processes running V8 now
	KernelErrors   uint64 // writes to the kernel that failed
}

func (s TrackerStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Int("files_inspected", s.FilesInspected), slog.Int("v8", s.V8s),
		slog.Int("unnamed", s.Unnamed), slog.Int("unsupported", s.Unsupported), slog.Int("processes", s.Processes), slog.Uint64("kernel_errors", s.KernelErrors))
}

// Tracker finds V8 among each process's mappings and tells the kernel how to walk it.
type Tracker struct {
	cfg     TrackerConfig
	files   *interp.Files[V8]
	procs   *interp.Procs[Image]
	unnamed atomic.Int64
}

// NewTracker returns a Tracker writing to cfg.Kernel.
func NewTracker(cfg TrackerConfig) *Tracker {
	t := &Tracker{cfg: cfg, files: interp.NewFiles(cfg.MaxFiles, Inspect, ErrNotV8, cfg.OnError), procs: interp.NewProcs[Image](cfg.Kernel)}
	t.files.Found = func(path string, v *V8) {
		if v.Unnamed == nil {
			return
		}
		t.unnamed.Add(1)
		if cfg.OnError != nil {
			cfg.OnError(path, fmt.Errorf("its frames are walked and named [v8]: %w", v.Unnamed))
		}
	}
	return t
}

// jitSpan is the span of a process's anonymous executable mappings: V8's code space.
func jitSpan(mappings []*trace.Mapping) [2]uint64 {
	var span [2]uint64
	for _, m := range mappings {
		if m.File != nil || strings.HasPrefix(m.Path, "[") || (m.Path != "" && !strings.HasPrefix(m.Path, "[anon")) {
			continue
		}
		if span[0] == 0 || m.Start < span[0] {
			span[0] = m.Start
		}
		span[1] = max(span[1], m.End)
	}
	return span
}

// maxCodeRange bounds the span taken for V8's code range: V8 reserves at most 128 MiB on
// x64 (kMaximalCodeRangeSize); 4 GiB is the most any of its configurations reserve.
const maxCodeRange = 4 << 30

// codeRange widens the span of a process's anonymous executable mappings to the run of
// adjacent anonymous mappings around it, as /proc/PID/maps lists them: V8 reserves its
// code range at once and makes pages of it executable as it compiles, so pages it makes
// executable later lie in the same run. Only executable pages hold a pc: the rest of the
// run costs nothing.
func codeRange(maps []byte, span [2]uint64) [2]uint64 {
	if span[0] == 0 {
		return span
	}
	type r struct{ start, end uint64 }
	var anon []r
	for line := range strings.Lines(string(maps)) {
		m, err := procfs.ParseMapsLine(line)
		if err != nil || m.Inode != 0 || m.Path != "" || m.End <= m.Start {
			continue // a file's, a named region's ([heap], [stack]) or a line that does not parse
		}
		anon = append(anon, r{m.Start, m.End})
	}
	out := span
	for i := 0; i < len(anon); {
		j := i
		for j+1 < len(anon) && anon[j+1].start == anon[j].end {
			j++
		}
		lo, hi := anon[i].start, anon[j].end
		if lo <= span[0] && span[1] <= hi && hi-lo <= maxCodeRange {
			out = [2]uint64{lo, hi}
		}
		i = j + 1
	}
	return out
}

// remapped finds the builtins' copy V8 maps beside its code: a mapping of the same file
// holding the builtins' file offsets at another place than the file's load bias puts them.
func remapped(v *V8, f *objfile.File, bias uint64, mappings []*trace.Mapping) [2]uint64 {
	off, ok := v.fileOffset(v.Builtins[0])
	if !ok {
		return [2]uint64{}
	}
	size := v.Builtins[1] - v.Builtins[0]
	for _, m := range mappings {
		if m.File == nil || m.File.ID() != f.ID() || off < m.Offset || off-m.Offset >= m.End-m.Start {
			continue
		}
		start := m.Start + (off - m.Offset)
		if start == v.Builtins[0]+bias {
			continue // the file's own text
		}
		return [2]uint64{start, min(start+size, m.End)}
	}
	return [2]uint64{}
}

// ProcessMappings looks for V8 among a process's executable mappings; a process whose
// JIT code grows is told again.
func (t *Tracker) ProcessMappings(pid uint32, execID uint64, mappings []*trace.Mapping) {
	for _, m := range mappings {
		if m.File == nil || m.File.IsGo {
			continue
		}
		v := t.files.Get(m.File)
		if v == nil {
			continue
		}
		bias, ok := v.Bias(m.Start, m.Offset)
		if !ok {
			continue
		}
		md := &v.Meta
		jit := codeRange(t.cfg.readMaps(pid), jitSpan(mappings))
		remap := remapped(v, m.File, bias, mappings)
		state := KernelState{
			ExecID:              execID,
			BuiltinsStart:       v.Builtins[0] + bias,
			BuiltinsEnd:         v.Builtins[1] + bias,
			RemapStart:          remap[0],
			RemapEnd:            remap[1],
			JitStart:            jit[0],
			JitEnd:              jit[1],
			OffFpContext:        int16(md.FPContext),
			OffFpFunction:       int16(md.FPFunction),
			OffFpBytecodeOffset: int16(md.FPBytecodeOffset),
			FunctionShared:      uint16(md.FunctionShared),
			SmiShift:            uint8(md.SmiShift),
			TypeEntry:           uint8(md.FrameEntry),
			TypeConstructEntry:  uint8(md.FrameConstructEntry),
		}
		if in := v.Interpreter; in.Handlers[1] != 0 {
			off := func(a uint64) uint32 { return uint32(a - v.Builtins[0]) }
			state.EntryStart, state.EntryEnd = off(in.Entry[0]), off(in.Entry[1])
			state.HandlersStart, state.HandlersEnd = off(in.Handlers[0]), off(in.Handlers[1])
			state.OffFpBytecodeArray = int16(md.FPBytecodeArray)
		}
		changed := t.procs.Update(pid, func(old *Image) *Image {
			if old != nil && old.bias == bias && old.execID == execID && old.state == state {
				return nil
			}
			img := &Image{v8: v, bias: bias, execID: execID, state: state}
			if old != nil && old.bias == bias && old.execID == execID {
				// The same image, its code grown: the namer keeps reading through it.
				img.isMap.Store(old.isMap.Load())
			}
			return img
		})
		if changed {
			// No code regions: the kernel walks V8's frames within the native walk, from
			// the code this state says is V8's.
			t.procs.Tell(pid, execID, &state, nil)
		}
		return
	}
	t.procs.Forget(pid)
}

// ProcessGone forgets a process.
func (t *Tracker) ProcessGone(pid uint32) { t.procs.Forget(pid) }

// Image returns V8 as a process maps it, or nil.
func (t *Tracker) Image(pid uint32) *Image { return t.procs.Image(pid) }

// Stats returns the counts so far.
func (t *Tracker) Stats() TrackerStats {
	fs := t.files.Stats()
	procs, kernelErrors := t.procs.Counts()
	return TrackerStats{FilesInspected: fs.Inspected, V8s: fs.Found, Unnamed: int(t.unnamed.Load()), Unsupported: fs.Unsupported,
		Processes: procs, KernelErrors: kernelErrors}
}
