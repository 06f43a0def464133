package pipeline

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"unsafe"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/tracectx"
	"github.com/sonde-profiler/sonde/unwind"
)

// kernelTables lets the unwind package write to the sampler's maps without knowing BPF.
// unwind's kernel types have bpf's generated layouts field for field (TestKernelTypesAgree
// holds them together), so the adapter reinterprets slices instead of copying them.
type kernelTables struct{ s *bpf.Sampler }

// asKernel views a slice of one layout as the other's.
func asKernel[To, From any](from []From) []To {
	if len(from) == 0 {
		return nil
	}
	return unsafe.Slice((*To)(unsafe.Pointer(unsafe.SliceData(from))), len(from))
}

func (k kernelTables) AddTable(t unwind.KernelTable, goRuntime *unwind.KernelGoRuntime) (uint32, error) {
	var g *bpf.GoRuntime
	if goRuntime != nil {
		g = &asKernel[bpf.GoRuntime]([]unwind.KernelGoRuntime{*goRuntime})[0]
	}
	rows := bpf.TableRows{Len: t.Rows, First: t.First, Last: t.Last, Each: func(part func([]bpf.UnwindRow) error) error {
		return t.Each(func(rows []unwind.KernelRow) error { return part(asKernel[bpf.UnwindRow](rows)) })
	}}
	id, err := k.s.AddTable(rows, g)
	if errors.Is(err, bpf.ErrTableFull) {
		return 0, errors.Join(unwind.ErrTableFull, err)
	}
	return id, err
}

func (k kernelTables) RemoveTable(id uint32) error { return k.s.RemoveTable(id) }

func (k kernelTables) SetProcess(pid uint32, execID uint64, mappings []unwind.KernelMapping) error {
	return k.s.SetProcess(pid, execID, asKernel[bpf.ExecMapping](mappings))
}

func (k kernelTables) DeleteProcess(pid uint32) error { return k.s.DeleteProcess(pid) }

// kernelGoroutines puts the sampler's goroutine probes on Go binaries, named to the
// kernel by a descriptor sonde holds open: the file checked to be the one mapped, in
// whatever mount namespace its processes run. The first failure is logged.
type kernelGoroutines struct {
	s      *bpf.Sampler
	log    *slog.Logger
	logged *sync.Once
}

// goroutineProbes is the Maintainer's unwind.GoroutineProbes: nil unless goroutines'
// waits are recorded.
func goroutineProbes(s *bpf.Sampler, cfg *Config, log *slog.Logger) unwind.GoroutineProbes {
	if !cfg.OffCPU || !cfg.OffCPUGoroutines {
		return nil
	}
	return kernelGoroutines{s: s, log: log, logged: new(sync.Once)}
}

func (k kernelGoroutines) AttachGoroutines(f *objfile.File, at unwind.GoProbes) (io.Closer, error) {
	c, err := k.attach(f, at)
	if err != nil {
		k.logged.Do(func() {
			k.log.Warn("goroutines' waits are not recorded in a Go program (counted as unwind.go_probe_errors)", "file", f.Path, "err", err)
		})
	}
	return c, err
}

func (k kernelGoroutines) attach(f *objfile.File, at unwind.GoProbes) (io.Closer, error) {
	h, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return k.s.AttachGoroutines(fmt.Sprintf("/proc/self/fd/%d", h.Fd()), at.Park, at.Execute)
}

// kernelContexts tells the sampler where processes publish their threads' trace context.
type kernelContexts struct{ s *bpf.Sampler }

func (k kernelContexts) TraceContext(pid uint32, execID uint64, c tracectx.Kernel) {
	if !c.Published() {
		k.s.DeleteTraceContext(pid)
		return
	}
	p := bpf.TraceContextProc{ExecID: execID}
	if c.HasTLS {
		p.TLS, p.TLSOffset = bpf.TLSStatic, c.TLS.Offset
		if c.TLS.Dynamic {
			p.TLS, p.TLSModule = bpf.TLSDTV, c.TLS.Module
			p.DTVOffset, p.DTVLen, p.DTVShift = c.TLS.DTVOffset, c.TLS.DTVLen, c.TLS.DTVShift
		}
	}
	if g := c.Go; g != nil {
		p.GoLayout = bpf.GoLabelsMap
		if g.SliceLabels {
			p.GoLayout = bpf.GoLabelsSlice
		}
		p.GoGOffset, p.GoGM, p.GoMCurg, p.GoGLabels = g.GOffset, g.GM, g.MCurg, g.GLabels
	}
	// A full map leaves the process without links; its samples are counted all the same.
	k.s.SetTraceContext(pid, p)
}

func (k kernelContexts) TraceContextGone(pid uint32) { k.s.DeleteTraceContext(pid) }
