package ruby

import (
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/trace"
	"github.com/sonde-profiler/sonde/tracectx"
)

// KernelState is what the kernel needs to walk a process's Ruby frames: the kernel's struct
// ruby_proc (bpf/ruby.h), field for field.
type KernelState struct {
	ExecID                uint64
	ExecStart, ExecEnd    uint64 // vm_exec: an activation
	VMStart, VMEnd        uint64 // vm_exec_core, the loop it calls
	ColdStart, ColdEnd    uint64 // its out-of-line part, or 0, 0
	JITStart, JITEnd      uint64 // YJIT's code, or 0, 0
	TLSOffset             int64  // ruby_current_ec from the thread pointer, or in its module's block
	TLSModule             uint64 // dynamic TLS: the module; 0: static
	DTVOffset, DTVLen     int32
	DTVShift              uint16
	ECVMStack             uint16
	ECVMStackSize, ECCFP  uint16
	CFPSize, CFPPC        uint16
	CFPIseq, CFPEP        uint16
	IseqBody, BodyEncoded uint16
	_                     [2]uint16
}

// KernelStateFor places a VM's facts at its load bias, with where ruby_current_ec is in
// the process, for the exec execID.
func KernelStateFor(v *VM, bias, execID uint64, ec tracectx.Where) *KernelState {
	l := v.Layout
	s := &KernelState{
		ExecID:    execID,
		ExecStart: v.Exec[0] + bias, ExecEnd: v.Exec[1] + bias,
		VMStart: v.Loop[0] + bias, VMEnd: v.Loop[1] + bias,
		TLSOffset: ec.Offset,
		ECVMStack: uint16(l.ECVMStack), ECVMStackSize: uint16(l.ECVMStackSize), ECCFP: uint16(l.ECCFP),
		CFPSize: uint16(l.CFPSize), CFPPC: uint16(l.CFPPC), CFPIseq: uint16(l.CFPIseq), CFPEP: uint16(l.CFPEP),
		IseqBody: uint16(l.IseqBody), BodyEncoded: uint16(l.BodyEncoded),
	}
	if v.LoopCold[1] != 0 {
		s.ColdStart, s.ColdEnd = v.LoopCold[0]+bias, v.LoopCold[1]+bias
	}
	if ec.Dynamic {
		s.TLSModule, s.DTVOffset, s.DTVLen, s.DTVShift = ec.Module, ec.DTVOffset, ec.DTVLen, uint16(ec.DTVShift)
	}
	return s
}

func (s *KernelState) regions() []interp.Region {
	return []interp.Region{{Start: s.ExecStart, End: s.ExecEnd}, {Start: s.VMStart, End: s.VMEnd}, {Start: s.ColdStart, End: s.ColdEnd}}
}

// TrackerConfig configures a Tracker.
type TrackerConfig struct {
	Kernel   interp.Kernel
	MaxFiles int
	OnError  func(path string, err error)
	// Memory opens a process's memory for the TLS lookup; nil means tracectx.ProcMem.
	Memory func(pid uint32) tracectx.Memory
}

// TrackerStats counts what a Tracker did.
type TrackerStats struct {
	FilesInspected int
	VMs            int    // files holding a CRuby sonde can walk
	Unsupported    int    // files holding one it cannot (version, build)
	Processes      int    // processes running Ruby now
	TLSErrors      uint64 // processes whose ruby_current_ec could not be located
	KernelErrors   uint64
}

func (s TrackerStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Int("files_inspected", s.FilesInspected), slog.Int("vms", s.VMs),
		slog.Int("unsupported", s.Unsupported), slog.Int("processes", s.Processes),
		slog.Uint64("tls_errors", s.TLSErrors), slog.Uint64("kernel_errors", s.KernelErrors))
}

// Tracker finds CRuby among each process's mappings and tells the kernel how to walk it;
// it implements trace.MappingObserver, on the process tracker's goroutine.
type Tracker struct {
	cfg       TrackerConfig
	files     *interp.Files[VM]
	procs     *interp.Procs[Image]
	tlsErrors interp.Counts[uint64]
}

// NewTracker returns a Tracker writing to cfg.Kernel.
func NewTracker(cfg TrackerConfig) *Tracker {
	if cfg.Memory == nil {
		cfg.Memory = func(pid uint32) tracectx.Memory { return tracectx.ProcMem(pid) }
	}
	return &Tracker{cfg: cfg, files: interp.NewFiles(cfg.MaxFiles, Inspect, ErrNotRuby, cfg.OnError), procs: interp.NewProcs[Image](cfg.Kernel)}
}

// ProcessMappings looks for CRuby among a process's executable mappings.
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
		jit := yjitCode(v, m, mappings)
		if old := t.procs.Image(pid); old != nil && old.bias == bias && old.execID == execID && old.jit == jit {
			return // told already
		}
		ec, err := v.EC.Resolve(t.cfg.Memory(pid), bias, libcOf(mappings))
		if err != nil {
			t.tlsErrors.Add(func(n *uint64) { *n++ })
			return
		}
		state := KernelStateFor(v, bias, execID, ec)
		state.JITStart, state.JITEnd = jit[0], jit[1]
		if t.procs.Update(pid, func(*Image) *Image {
			img := &Image{Version: v.Version, Layout: v.Layout, bias: bias, execID: execID, lastOpID: v.LastOpID, jit: jit}
			if v.Symbols != 0 {
				img.symbols = v.Symbols + bias
			}
			return img
		}) {
			t.procs.Tell(pid, execID, state, state.regions())
		}
		return
	}
	t.procs.Forget(pid)
}

// yjitNear bounds how far from the VM's code YJIT's is: it reserves its memory near the
// code it calls, for 32-bit relative calls.
const yjitNear = 1 << 32

// yjitReserve is what YJIT reserves by default (--yjit-exec-mem-size, 48 MiB in 3.3): its
// pages become executable from the start of the reservation on, as it compiles.
const yjitReserve = 48 << 20

// yjitCode returns the span of YJIT's code in a process whose VM (mapped at vm) was built
// with it, or zero: the anonymous executable mappings near the VM's code, where YJIT's
// reservation is made executable page by page as it compiles, and the rest of a default
// reservation after them, short of any other executable mapping, so that pages made
// executable after this reading are in it too. A larger reservation's later pages are
// found by the reading that samples in them bring.
func yjitCode(v *VM, vm *trace.Mapping, mappings []*trace.Mapping) (span [2]uint64) {
	if !v.YJIT {
		return span
	}
	for _, m := range mappings {
		if m.File != nil || m.Path != "" || m.End <= m.Start {
			continue
		}
		if dist := max(m.Start, vm.Start) - min(m.End, vm.End); dist > yjitNear {
			continue
		}
		if span[1] == 0 {
			span = [2]uint64{m.Start, m.End}
			continue
		}
		span[0], span[1] = min(span[0], m.Start), max(span[1], m.End)
	}
	if span[1] == 0 {
		return span
	}
	end := max(span[1], span[0]+yjitReserve)
	for _, m := range mappings {
		if m.Start >= span[1] && m.Start < end {
			end = m.Start
		}
	}
	span[1] = end
	return span
}

// libcOf tells musl's processes from glibc's, whose TLS layouts differ.
func libcOf(mappings []*trace.Mapping) tracectx.Libc {
	for _, m := range mappings {
		if base := filepath.Base(m.Path); strings.HasPrefix(base, "ld-musl-") || strings.HasPrefix(base, "libc.musl-") {
			return tracectx.Musl
		}
	}
	return tracectx.Glibc
}

// ProcessGone forgets a process.
func (t *Tracker) ProcessGone(pid uint32) { t.procs.Forget(pid) }

// Image returns the VM a process runs, as mapped there, or nil.
func (t *Tracker) Image(pid uint32) *Image { return t.procs.Image(pid) }

// Stats returns the counts so far.
func (t *Tracker) Stats() TrackerStats {
	fs := t.files.Stats()
	procs, kernelErrors := t.procs.Counts()
	return TrackerStats{FilesInspected: fs.Inspected, VMs: fs.Found, Unsupported: fs.Unsupported,
		Processes: procs, TLSErrors: t.tlsErrors.Get(), KernelErrors: kernelErrors}
}
