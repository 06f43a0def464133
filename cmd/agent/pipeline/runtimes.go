package pipeline

import (
	"fmt"
	"log/slog"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/interp/jvm"
	"github.com/sonde-profiler/sonde/interp/node"
	"github.com/sonde-profiler/sonde/interp/php"
	"github.com/sonde-profiler/sonde/interp/python"
	"github.com/sonde-profiler/sonde/interp/ruby"
	"github.com/sonde-profiler/sonde/trace"
	"github.com/sonde-profiler/sonde/unwind"
)

// runtimeSpecs are the language runtimes whose frames the kernel walks beside the native
// ones: the one list of them (bpf/runtimes.h is the kernel's).
var runtimeSpecs = []interp.Spec{python.Spec, node.Spec, jvm.Spec, php.Spec, ruby.Spec}

// registeredRuntime is a runtime as the pipeline drives it.
type registeredRuntime struct {
	spec interp.Spec
	rt   interp.Runtime
}

// kernelMaps are the runtimes' maps, for the loader to size.
func kernelMaps(specs []interp.Spec) []bpf.RuntimeMaps {
	out := make([]bpf.RuntimeMaps, 0, len(specs))
	for _, s := range specs {
		out = append(out, mapsOf(s))
	}
	return out
}

func mapsOf(s interp.Spec) bpf.RuntimeMaps {
	return bpf.RuntimeMaps{Number: s.Number, Procs: s.Maps.Procs, Counters: s.Maps.Counters, Ends: s.Maps.Ends, Sizes: s.Maps.Sizes}
}

// framePointerCode are the runtimes' finders of code walked by frame pointer.
func framePointerCode(specs []interp.Spec) []unwind.FramePointerCodeFunc {
	var out []unwind.FramePointerCodeFunc
	for _, s := range specs {
		if s.FramePointerCode != nil {
			out = append(out, s.FramePointerCode)
		}
	}
	return out
}

// newRuntimes makes the runtimes of specs, each writing its maps through s. renew is the
// aggregator's RenewImage, which exists only later.
func newRuntimes(specs []interp.Spec, s *bpf.Sampler, renew func(pid uint32, image uint64), b budget, log *slog.Logger) ([]registeredRuntime, error) {
	var out []registeredRuntime
	for _, spec := range specs {
		k, err := s.Runtime(mapsOf(spec), spec.State)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", spec.Name, err)
		}
		msg := spec.Unsupported
		out = append(out, registeredRuntime{spec: spec, rt: spec.New(interp.Env{
			Kernel:       runtimeKernel{k},
			OnError:      func(path string, err error) { log.Info(msg, "file", path, "err", err) },
			OnReuse:      renew,
			MaxBytes:     b.runtimeBytes[spec.Name],
			MaxProcesses: b.maxProcesses,
		})})
	}
	return out, nil
}

// describers are the runtimes that describe their processes.
func describers(rts []registeredRuntime) []trace.Describer {
	var out []trace.Describer
	for _, r := range rts {
		if d, ok := r.rt.(trace.Describer); ok {
			out = append(out, d)
		}
	}
	return out
}

// runtimeKernel lets a runtime write its maps through bpf.RuntimeKernel without knowing BPF.
type runtimeKernel struct{ k *bpf.RuntimeKernel }

func (r runtimeKernel) Set(pid uint32, execID uint64, state any, regions []interp.Region) error {
	if v, ok := state.(interp.KernelValuer); ok {
		var err error
		if state, err = v.KernelValue(); err != nil {
			return fmt.Errorf("state of pid %d: %w", pid, err)
		}
	}
	kr := make([]bpf.Region, len(regions))
	for i, r := range regions {
		kr[i] = bpf.Region{Start: r.Start, End: r.End}
	}
	return r.k.Set(pid, execID, state, kr)
}

func (r runtimeKernel) Delete(pid uint32) error { return r.k.Delete(pid) }

func (r runtimeKernel) Lookup(name string, key, value any) (bool, error) {
	return r.k.Lookup(name, key, value)
}

func (r runtimeKernel) Ends() (map[string]uint64, error) { return r.k.Ends() }
