package symbolize

import (
	"encoding/binary"
	"runtime"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

// A function that ends by jumping to another (a tail call) leaves no frame: a stack
// sampled in the callee shows the caller's caller above it, and the function in between
// is missing (main → cycle → nap reads main → nap when cycle ends with `jmp nap`). Where
// a return address follows a direct call to f, and the frame above it is not f but a
// function f jumps to directly, f is put back between them, as debuggers show
// tail-call frames. Both ends must be in the same file, and only direct x86-64 calls
// (E8 rel32) and jumps (E9 rel32, EB rel8) are read: an indirect call says nothing of its
// target. A byte that only looks like a jump would have to land exactly on the start of
// the very function above the return address to be taken for one.

const (
	// maxTailScan bounds the bytes of one function scanned for its direct jumps.
	maxTailScan = 1 << 16
	// maxTailEntries bounds each of the tail-call caches; past it they start over.
	maxTailEntries = 1 << 14
	// tailDepth is how many functions in a row a gap may hide (f jumps to g jumps to h).
	tailDepth = 2
)

type tailKey struct {
	file uint64 // fileRef.hash
	addr uint64 // an ELF virtual address in that file
}

// tailCache remembers across calls what the code said: the gap between two locations (the
// recovered frames, or none), each function's direct jump targets, and the locations made
// for recovered frames, which samples share.
type tailCache struct {
	gaps  map[[2]*trace.Location][]*trace.Location
	jumps map[tailKey][]uint64
	locs  map[tailKey]*trace.Location
}

func (c *tailCache) reset() {
	c.gaps = make(map[[2]*trace.Location][]*trace.Location)
	c.jumps = make(map[tailKey][]uint64)
	c.locs = make(map[tailKey]*trace.Location)
}

// recoverTailCalls puts back the frames tail calls left out of p's samples. A sample it
// changes gets a new Locations slice and no Chunks; the recovered locations are added to
// p.Locations.
func (s *Symbolizer) recoverTailCalls(p *trace.Profile, refs map[*objfile.File]*fileRef) {
	if runtime.GOARCH != "amd64" {
		return
	}
	if s.tails.gaps == nil || len(s.tails.gaps) > maxTailEntries || len(s.tails.jumps) > maxTailEntries || len(s.tails.locs) > maxTailEntries {
		s.tails.reset()
	}
	listed := map[*trace.Location]bool{}
	for _, smp := range p.Samples {
		if smp == nil {
			continue
		}
		var out []*trace.Location // nil until a gap is found
		for i, outer := range smp.Locations {
			if i > 0 {
				if gap := s.tailGap(smp.Locations[i-1], outer, refs); len(gap) > 0 {
					if out == nil {
						out = append(make([]*trace.Location, 0, len(smp.Locations)+len(gap)), smp.Locations[:i]...)
					}
					// Innermost first: the function that jumped to the callee comes first.
					for _, l := range gap {
						out = append(out, l)
						if !listed[l] {
							listed[l] = true
							p.Locations = append(p.Locations, l)
						}
					}
				}
			}
			if out != nil {
				out = append(out, outer)
			}
		}
		if out != nil {
			smp.Locations, smp.Chunks = out, nil
			s.stats.TailCallsRecovered++
		}
	}
}

// tailGap returns the frames tail calls left out between inner and its caller outer,
// innermost first; nil when there are none.
func (s *Symbolizer) tailGap(inner, outer *trace.Location, refs map[*objfile.File]*fileRef) []*trace.Location {
	if inner == nil || outer == nil || inner.Kind != trace.FrameNative || outer.Kind != trace.FrameNative ||
		outer.Mapping == nil || outer.Mapping.File == nil || inner.Mapping == nil || inner.Mapping.File != outer.Mapping.File {
		return nil
	}
	key := [2]*trace.Location{inner, outer}
	if gap, ok := s.tails.gaps[key]; ok {
		return gap
	}
	var gap []*trace.Location
	if fault := mmapfile.Guard(func() { gap = s.findGap(inner, outer, refs) }); fault != nil {
		gap = nil
	}
	s.tails.gaps[key] = gap
	return gap
}

func (s *Symbolizer) findGap(inner, outer *trace.Location, refs map[*objfile.File]*fileRef) []*trace.Location {
	f := outer.Mapping.File
	ref := refs[f]
	if ref == nil {
		id := f.ID()
		ref = &fileRef{id: id, hash: s.fileHash(id)}
		refs[f] = ref
	}
	obj, _ := s.object(ref, f)
	if obj == nil || obj.faulted || len(obj.maps) == 0 || obj.maps[0] == nil || obj.gopcln != nil {
		return nil
	}
	code := obj.maps[0].Bytes()
	raOff, ok := outer.FileOffset()
	if !ok || raOff < 5 || raOff > uint64(len(code)) || code[raOff-5] != 0xe8 {
		return nil // not after a direct call
	}
	raVaddr, ok := obj.syms.Vaddr(raOff)
	if !ok {
		return nil
	}
	target := raVaddr + uint64(int64(int32(binary.LittleEndian.Uint32(code[raOff-4:raOff]))))
	innerOff, ok := inner.FileOffset()
	if !ok {
		return nil
	}
	innerSym, ok := obj.syms.LookupFileOffset(innerOff)
	if !ok || innerSym.Value == target {
		return nil // the callee's own frame is there
	}
	callee, ok := obj.syms.Funcs.Lookup(target)
	if !ok || callee.Value != target {
		return nil
	}
	// Breadth first, tailDepth deep: the chain of direct jumps from the callee to the
	// function above the return address.
	type step struct {
		fn   Symbol
		prev int
	}
	steps := []step{{fn: callee, prev: -1}}
	for from, depth := 0, 0; depth < tailDepth; depth++ {
		to := len(steps)
		for i := from; i < to; i++ {
			for _, t := range s.directJumps(ref, obj, code, steps[i].fn) {
				if t == innerSym.Value {
					var chain []*trace.Location
					for j := i; j >= 0; j = steps[j].prev {
						if l := s.tailLocation(ref, obj, outer.Mapping, steps[j].fn); l != nil {
							chain = append(chain, l)
						}
					}
					return chain // the innermost (the last jump's source) first
				}
				if sym, ok := obj.syms.Funcs.Lookup(t); ok && sym.Value == t {
					steps = append(steps, step{fn: sym, prev: i})
				}
			}
		}
		from = to
	}
	return nil
}

// directJumps lists the functions fn jumps to directly (E9 rel32 or EB rel8 to a symbol's
// start), scanning its bytes.
func (s *Symbolizer) directJumps(ref *fileRef, obj *objFile, code []byte, fn Symbol) []uint64 {
	key := tailKey{file: ref.hash, addr: fn.Value}
	if jumps, ok := s.tails.jumps[key]; ok {
		return jumps
	}
	var jumps []uint64
	start, ok := obj.syms.FileOffset(fn.Value)
	size := min(fn.Size, uint64(maxTailScan))
	if ok && size > 0 && start < uint64(len(code)) {
		end := min(start+size, uint64(len(code)))
		for k := start; k+2 <= end; k++ {
			var t uint64
			switch {
			case code[k] == 0xe9 && k+5 <= end:
				t = fn.Value + (k - start) + 5 + uint64(int64(int32(binary.LittleEndian.Uint32(code[k+1:k+5]))))
			case code[k] == 0xeb: // a short jump reaches a neighbour
				t = fn.Value + (k - start) + 2 + uint64(int64(int8(code[k+1])))
			default:
				continue
			}
			if t >= fn.Value && t < fn.Value+fn.Size {
				continue // a jump within the function
			}
			if sym, ok := obj.syms.Funcs.Lookup(t); ok && sym.Value == t {
				jumps = append(jumps, t)
			}
		}
	}
	s.tails.jumps[key] = jumps
	return jumps
}

// tailLocation is the location standing for a recovered frame of fn, named as its entry.
func (s *Symbolizer) tailLocation(ref *fileRef, obj *objFile, m *trace.Mapping, fn Symbol) *trace.Location {
	key := tailKey{file: ref.hash, addr: fn.Value}
	if l, ok := s.tails.locs[key]; ok {
		return l
	}
	off, ok := obj.syms.FileOffset(fn.Value)
	if !ok || off < m.Offset {
		return nil
	}
	lines, source, _ := s.fileLines(ref, m.File, off)
	if len(lines) == 0 {
		return nil
	}
	// The entry's outermost function: what inlining put at its first instruction is not
	// what was called.
	outermost := lines[len(lines)-1]
	l := &trace.Location{Kind: trace.FrameNative, Address: m.Start + off - m.Offset, Mapping: m,
		Lines: []trace.Line{outermost}, NameSource: source}
	s.tails.locs[key] = l
	return l
}
