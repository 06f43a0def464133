package node

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/sonde-profiler/sonde/internal/lru"
	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/trace"
)

// How the kernel packs a frame's 58 bits (bpf/v8.h, enum v8_frame_encoding).
const (
	kindShift         = 56
	kindJIT           = 0
	kindBytecode      = 1
	kindBytecodeArray = 2
	returnBit         = 47
	sfiShift          = 3
	offsetBits        = 12
	offsetMask        = 1<<offsetBits - 1
	pcMask            = 1<<47 - 1
	sfiBits           = 44
)

// A frame's code identity as DecodeFrame gives it: a pc of compiled code carries jitFlag
// (and retFlag for a return address), an interpreted frame's BytecodeArray arrayFlag
// (its untagged address), which no address has; else it is a SharedFunctionInfo's
// untagged address.
const (
	jitFlag   = 1 << 62
	retFlag   = 1 << 61
	arrayFlag = 1 << 60
)

// EncodeBytecodeFrame writes an interpreted frame as the kernel does, for tests: the
// SharedFunctionInfo's tagged address and the frame's raw bytecode offset.
func EncodeBytecodeFrame(sfi uint64, offset uint32) uint64 {
	return trace.EncodeInterpFrame(Number, kindBytecode<<kindShift|(sfi>>sfiShift&(1<<sfiBits-1))<<offsetBits|uint64(min(offset, offsetMask)))
}

// EncodeBytecodeArrayFrame writes an interpreted frame as the kernel does where it knows
// the interpreter's code, for tests: the BytecodeArray's tagged address and the frame's
// raw bytecode offset.
func EncodeBytecodeArrayFrame(bytecode uint64, offset uint32) uint64 {
	return trace.EncodeInterpFrame(Number, kindBytecodeArray<<kindShift|(bytecode>>sfiShift&(1<<sfiBits-1))<<offsetBits|uint64(min(offset, offsetMask)))
}

// EncodeJITFrame writes a frame of compiled code as the kernel does, for tests.
func EncodeJITFrame(pc uint64, ret bool) uint64 {
	p := kindJIT<<kindShift | pc&pcMask
	if ret {
		p |= 1 << returnBit
	}
	return trace.EncodeInterpFrame(Number, p)
}

// DecodeFrame splits a frame's payload into its code identity and offset.
func DecodeFrame(payload uint64) (code uint64, offset uint32) {
	addr := (payload >> offsetBits & (1<<sfiBits - 1)) << sfiShift
	switch payload >> kindShift & 3 {
	case kindBytecode:
		return addr, uint32(payload & offsetMask)
	case kindBytecodeArray:
		return arrayFlag | addr, uint32(payload & offsetMask)
	}
	code = jitFlag | payload&pcMask
	if payload>>returnBit&1 != 0 {
		code |= retFlag
	}
	return code, 0
}

// NamerConfig configures a Namer.
type NamerConfig struct {
	// Images tells which V8 a process runs: the Tracker.
	Images interface{ Image(pid uint32) *Image }
	// Memory opens a process's memory; nil means ProcessMemory.
	Memory func(pid uint32) Memory
	// MaxCodes bounds the functions and pcs kept, named or failed; 0 means DefaultMaxCodes.
	MaxCodes int
	// MaxScripts bounds the scripts whose line ends are kept; 0 means DefaultMaxScripts.
	MaxScripts int
	// MaxBytes bounds, roughly, the bytes of what is kept: line ends and source positions,
	// names, files; 0 means DefaultMaxBytes. Half goes to scripts, half to functions.
	MaxBytes int
	// MaxPending bounds what waits to be read; 0 means DefaultMaxPending.
	MaxPending int
	// Recheck is how long what was read is trusted before it is read again when next seen.
	Recheck time.Duration
	// Retry is how long after a failed read the code is read again when next seen or
	// named: a function V8 had not finished installing, code being moved. 0 means
	// DefaultRetry.
	Retry time.Duration
	// MaxIdle lets what was read for code go once no stack showed the code for this
	// long: code compiled without end (new Function in a loop) leaves names of code long
	// collected, and the cache would grow with them until MaxBytes. 0 means
	// DefaultMaxIdle.
	MaxIdle time.Duration
	// OnReuse hears that an address now holds other code: the aggregator's RenewImage.
	OnReuse func(pid uint32, image uint64)
	// Functions tells the function the kernel found in a baseline frame; nil: baseline
	// frames are not named.
	Functions FunctionFinder
	now       func() time.Time
}

// Defaults of NamerConfig.
const (
	DefaultMaxCodes   = 1 << 16
	DefaultMaxScripts = 256
	DefaultMaxBytes   = 64 << 20
	DefaultMaxPending = 4096
	DefaultRecheck    = 5 * time.Second
	DefaultRetry      = 500 * time.Millisecond
	DefaultMaxIdle    = 30 * time.Second
)

// NamerStats counts what a Namer did.
type NamerStats struct {
	Read        uint64 // functions and pcs read from processes
	ReadErrors  uint64 // reads that failed: the process exited, the object moved or is not named
	Dropped     uint64 // not read early for a full queue
	Named       uint64 // locations named
	Unnamed     uint64 // locations left unnamed
	Rechecks    uint64
	Retries     uint64 // failed reads tried again
	Reused      uint64 // addresses found holding other code than the one named
	Idle        uint64 // let go after MaxIdle unseen
	Cached      int
	CachedBytes int
}

func (s NamerStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Uint64("read", s.Read), slog.Uint64("read_errors", s.ReadErrors),
		slog.Uint64("dropped", s.Dropped), slog.Uint64("named", s.Named), slog.Uint64("unnamed", s.Unnamed),
		slog.Uint64("rechecks", s.Rechecks), slog.Uint64("retries", s.Retries), slog.Uint64("reused", s.Reused), slog.Uint64("idle", s.Idle), slog.Int("cached", s.Cached), slog.Int("cached_bytes", s.CachedBytes))
}

// entry is what was read for a code identity: an interpreted function, or the frames at
// a pc of compiled code; nil both when it could not be read.
type entry struct {
	fn    *function
	lines []trace.Line
}

func (e *entry) ok() bool { return e.fn != nil || e.lines != nil }

func (e *entry) same(o *entry) bool {
	switch {
	case e.fn != nil && o.fn != nil:
		return e.fn.name == o.fn.name && e.fn.file == o.fn.file && e.fn.start == o.fn.start
	case e.lines != nil && o.lines != nil:
		return slices.Equal(e.lines, o.lines)
	}
	return false
}

type scriptKey struct{ image, script uint64 }

type scriptInfo struct {
	file     string
	lineEnds []int
}

func (s *scriptInfo) size() int { return 64 + len(s.file) + 8*len(s.lineEnds) }

func (e *entry) size() int {
	n := 64
	if e.fn != nil {
		n += 64 + len(e.fn.name) + len(e.fn.file) + 16*len(e.fn.positions)
	}
	for _, l := range e.lines {
		n += 64 + len(l.Function) + len(l.SystemName) + len(l.File)
	}
	return n
}

// Namer names V8 frames, reading what they need as soon as stacks first show them.
type Namer struct {
	cfg     NamerConfig
	codes   *interp.Codes[*entry]
	mu      sync.Mutex
	scripts *lru.LRU[scriptKey, *scriptInfo]
	stats   interp.Counts[NamerStats]
	// Bytes of what scripts keep, kept up to date by its eviction callback, which runs
	// under mu.
	scriptBytes int
}

// NewNamer returns a Namer; Run reads what SeenCode queues.
func NewNamer(cfg NamerConfig) *Namer {
	if cfg.Memory == nil {
		cfg.Memory = func(pid uint32) Memory { return ProcessMemory(pid) }
	}
	if cfg.MaxScripts <= 0 {
		cfg.MaxScripts = DefaultMaxScripts
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	scripts := lru.New[scriptKey, *scriptInfo](cfg.MaxScripts)
	n := &Namer{cfg: cfg, scripts: scripts}
	// Half of MaxBytes for what was read of code, half for the scripts' line ends.
	n.codes = interp.NewCodes(interp.CodesConfig[*entry]{
		MaxCodes:    cmp.Or(max(cfg.MaxCodes, 0), DefaultMaxCodes),
		MaxPending:  cmp.Or(max(cfg.MaxPending, 0), DefaultMaxPending),
		MaxBytes:    cfg.MaxBytes / 2,
		Size:        (*entry).size,
		MaxIdle:     cmp.Or(max(cfg.MaxIdle, 0), DefaultMaxIdle),
		Recheck:     cmp.Or(max(cfg.Recheck, 0), DefaultRecheck),
		Read:        func(pid uint32, k interp.CodeKey, _ bool) (*entry, bool) { return n.read(pid, k), false },
		Recheckable: (*entry).ok,
		Failed:      func(e *entry) bool { return !e.ok() },
		Retry:       cmp.Or(max(cfg.Retry, 0), DefaultRetry),
		Same: func(pid uint32, k interp.CodeKey, old *entry) (bool, bool) {
			e := n.read(pid, k)
			return e.ok() && e.same(old), true
		},
		Touch:   true,
		OnReuse: cfg.OnReuse,
		Now:     cfg.now,
	})
	scripts.SetOnEvict(func(_ scriptKey, s *scriptInfo) { n.scriptBytes -= s.size() })
	return n
}

// addScript keeps a script's line ends within the bounds; n.mu is held.
func (n *Namer) addScript(k scriptKey, s *scriptInfo) {
	n.scripts.Remove(k)
	n.scripts.Add(k, s)
	n.scriptBytes += s.size()
	for n.scriptBytes > n.cfg.MaxBytes/2 {
		if _, _, ok := n.scripts.RemoveOldest(); !ok {
			break
		}
	}
}

// SeenCode queues code to be read, unless known or queued; what was read long enough
// ago is queued to be checked again.
func (n *Namer) SeenCode(pid uint32, image, code uint64) {
	if img := n.cfg.Images.Image(pid); img != nil && img.v8.Unnamed != nil {
		return // named [v8]: nothing to read
	}
	n.codes.Seen(pid, interp.CodeKey{Image: image, Code: code})
}

// Run reads what SeenCode queued until ctx ends.
func (n *Namer) Run(ctx context.Context) error { return n.codes.Run(ctx) }

// read reads what a code identity names in a process.
func (n *Namer) read(pid uint32, k interp.CodeKey) *entry {
	e := &entry{}
	img := n.cfg.Images.Image(pid)
	if img == nil {
		n.stats.Add(func(s *NamerStats) { s.ReadErrors++ })
		return e
	}
	h := img.heap(n.cfg.Memory(pid))
	defer img.keep(h)
	var err error
	switch {
	case k.Code&jitFlag != 0:
		e.lines, err = n.jitLines(h, pid, k.Image, k.Code&pcMask, k.Code&retFlag != 0)
	case k.Code&arrayFlag != 0:
		e.fn, err = n.interpreted(h, pid, k.Image, k.Code&^arrayFlag)
	default:
		e.fn, err = n.function(h, k.Image, k.Code)
	}
	n.stats.Add(func(s *NamerStats) {
		s.Read++
		if err != nil {
			s.ReadErrors++
		}
	})
	return e
}

func (n *Namer) function(h *heap, image, sfi uint64) (*function, error) {
	return h.sfi(sfi, func(script uint64) ([]int, string, error) {
		k := scriptKey{image: image, script: script}
		n.mu.Lock()
		si, ok := n.scripts.Get(k)
		n.mu.Unlock()
		if ok {
			return si.lineEnds, si.file, nil
		}
		ends, file, err := h.script(script)
		n.mu.Lock()
		n.addScript(k, &scriptInfo{file: file, lineEnds: ends})
		n.mu.Unlock()
		return ends, file, err
	})
}

// interpreted names an interpreted frame by its BytecodeArray: by the function the kernel
// last found running it, once that function's bytecode is still the array. An array at
// the address of one collected, run by another function, is the new function's bytecode,
// not the old one's, so the frame is named by what runs it or not at all.
func (n *Namer) interpreted(h *heap, pid uint32, image, bytecode uint64) (*function, error) {
	if n.cfg.Functions == nil {
		return nil, errors.New("an interpreted frame's function, which only the kernel has")
	}
	tagged, ok := n.cfg.Functions.FunctionAt(pid, bytecode+1)
	if !ok {
		return nil, errors.New("an interpreted frame whose function the kernel no longer has")
	}
	sfi, ok := untag(tagged)
	if !ok || h.bytecode(sfi) != bytecode {
		return nil, errors.New("an interpreted frame whose function's bytecode is other code's")
	}
	return n.function(h, image, sfi)
}

// jitLines names the functions at a pc of compiled code, innermost first.
func (n *Namer) jitLines(h *heap, pid uint32, image, pc uint64, ret bool) ([]trace.Line, error) {
	frames, err := h.jitFrames(pc, ret)
	var baseline *baselineCode
	if errors.As(err, &baseline) {
		return n.baselineLines(h, pid, image, pc, baseline)
	}
	if err != nil {
		return nil, err
	}
	// The code at the pc now must be the sampled frame's function's, when the kernel
	// still has what it was: other code in its place is not named in its stead.
	if n.cfg.Functions != nil && len(frames) > 0 {
		if tagged, ok := n.cfg.Functions.FunctionAt(pid, pc); ok {
			if sfi, _ := untag(tagged); sfi != frames[len(frames)-1].sfi {
				return nil, errors.New("the code at the pc is another function's than the sampled frame's")
			}
		}
	}
	lines := make([]trace.Line, 0, len(frames))
	for _, f := range frames {
		fn, err := n.function(h, image, f.sfi)
		if err != nil {
			return nil, err
		}
		lines = append(lines, fn.lineAt(f.pos))
	}
	return lines, nil
}

// baselineLines names a frame of baseline code by the function the kernel found in its
// frame, once that function's bytecode is the code's: at its first line, as the pc's
// bytecode offset is not read.
func (n *Namer) baselineLines(h *heap, pid uint32, image, pc uint64, b *baselineCode) ([]trace.Line, error) {
	if n.cfg.Functions == nil {
		return nil, b
	}
	tagged, ok := n.cfg.Functions.FunctionAt(pid, pc)
	if !ok {
		return nil, errors.New("baseline code whose function the kernel no longer has")
	}
	sfi, ok := untag(tagged)
	if !ok || h.bytecode(sfi) != b.bytecode {
		return nil, errors.New("baseline code whose function's bytecode is other code's")
	}
	fn, err := n.function(h, image, sfi)
	if err != nil {
		return nil, err
	}
	return []trace.Line{fn.lineAt(noPosition)}, nil
}

func (f *function) lineAt(pos int) trace.Line {
	name := f.name
	if name == "" {
		name = "<anonymous>"
	}
	return trace.Line{Function: name, SystemName: name, File: f.file, Line: f.line(pos)}
}

// Name returns the lines of a V8 location: one per function, inlined ones first.
func (n *Namer) Name(loc *trace.Location) ([]trace.Line, bool) {
	f := loc.Interp
	if f == nil {
		return nil, false
	}
	if img := n.cfg.Images.Image(f.PID); img != nil && img.v8.Unnamed != nil {
		n.stats.Add(func(s *NamerStats) { s.Unnamed++ })
		return []trace.Line{{Function: "[v8]", SystemName: "[v8]"}}, true
	}
	e, _ := n.codes.Get(f.PID, interp.CodeKey{Image: f.Image, Code: f.Code})
	var lines []trace.Line
	switch {
	case e.lines != nil:
		lines = e.lines
	case e.fn != nil:
		pos := noPosition
		img := n.cfg.Images.Image(f.PID)
		if f.Offset < offsetMask && img != nil {
			// The frame's offset counts from the BytecodeArray's tagged address.
			off := int(f.Offset) - int(img.v8.Meta.BytecodeHeader-1)
			if p, ok := at(e.fn.positions, off); ok && inliningID(p.pos) < 0 {
				pos = scriptOffset(p.pos)
			}
		}
		lines = []trace.Line{e.fn.lineAt(pos)}
	}
	if lines == nil {
		// What could not be read, tried again, is V8's code all the same: shown as [v8]
		// like the frames of a V8 sonde cannot name, never as the frame's raw value.
		n.stats.Add(func(s *NamerStats) { s.Unnamed++ })
		return []trace.Line{{Function: "[v8]", SystemName: "[v8]"}}, true
	}
	n.stats.Add(func(s *NamerStats) { s.Named++ })
	return lines, true
}

// Stats returns the counts so far.
func (n *Namer) Stats() NamerStats {
	st := n.stats.Get()
	cs := n.codes.Stats()
	n.mu.Lock()
	scriptBytes := n.scriptBytes
	n.mu.Unlock()
	st.Dropped, st.Rechecks, st.Retries, st.Reused, st.Idle = cs.Dropped, cs.Rechecks, cs.Retries, cs.Reused, cs.Idle
	st.Cached, st.CachedBytes = cs.Cached, cs.Bytes+scriptBytes
	return st
}
