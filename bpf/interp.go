package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// How the kernel writes a language runtime's frame among a sample's user frames (types.h,
// enum interp_frame_encoding): a tag no address has, the runtime's number, and 58 bits the
// runtime's own package decodes.
const (
	InterpFrameTagShift = uint(samplerInterpFrameEncodingINTERP_FRAME_TAG_SHIFT)
	InterpFrameTag      = uint64(samplerInterpFrameEncodingINTERP_FRAME_TAG)
	InterpRuntimeShift  = uint(samplerInterpFrameEncodingINTERP_RUNTIME_SHIFT)
	InterpRuntimeMax    = uint8(samplerInterpFrameEncodingINTERP_RUNTIME_MAX)
	InterpPayloadBits   = uint(samplerInterpFrameEncodingINTERP_PAYLOAD_BITS)
)

// MaxInterpRegions bounds the code regions of all runtimes of one process.
const MaxInterpRegions = len(samplerInterpProc{}.Regions)

// Region is a runtime's code in a process, [Start, End): a native frame there hands the
// sample to the runtime's kernel walker.
type Region struct{ Start, End uint64 }

// setRegions replaces runtime's regions in pid's entry, keeping other runtimes' regions of
// the same exec; no regions removes the runtime from the entry.
func (s *Sampler) setRegions(pid uint32, execID uint64, runtime uint8, regions []Region) error {
	if runtime == 0 || runtime > InterpRuntimeMax {
		return fmt.Errorf("runtime number %d out of range", runtime)
	}
	s.interpMu.Lock()
	defer s.interpMu.Unlock()
	var p samplerInterpProc
	if err := s.objs.InterpProcs.Lookup(pid, &p); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("read runtimes of pid %d: %w", pid, err)
	}
	if p.ExecId != execID {
		p = samplerInterpProc{ExecId: execID}
	}
	kept := make([]samplerInterpRegion, 0, MaxInterpRegions)
	for _, r := range p.Regions[:min(int(p.Count), MaxInterpRegions)] {
		if r.Runtime != uint32(runtime) {
			kept = append(kept, r)
		}
	}
	p.Runtimes &^= 1 << runtime
	for _, r := range regions {
		if r.End <= r.Start {
			continue
		}
		if len(kept) == MaxInterpRegions {
			return fmt.Errorf("runtimes of pid %d: more than %d code regions", pid, MaxInterpRegions)
		}
		kept = append(kept, samplerInterpRegion{Start: r.Start, End: r.End, Runtime: uint32(runtime)})
		p.Runtimes |= 1 << runtime
	}
	if len(kept) == 0 {
		if err := s.objs.InterpProcs.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete runtimes of pid %d: %w", pid, err)
		}
		return nil
	}
	p.Count = uint32(len(kept))
	p.Regions = [MaxInterpRegions]samplerInterpRegion{}
	copy(p.Regions[:], kept)
	if err := s.objs.InterpProcs.Put(pid, &p); err != nil {
		return fmt.Errorf("set runtimes of pid %d: %w", pid, err)
	}
	return nil
}
