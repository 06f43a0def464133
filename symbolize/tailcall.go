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

// gapKey is a caller's return address and the code above it, by file offsets: the same in
// every process that maps the file.
type gapKey struct {
	file         uint64 // fileRef.hash
	inner, outer uint64
}

// tailFunc is a function a gap hides, by its start (an ELF virtual address) and size.
type tailFunc struct{ start, size uint64 }

// tailCache remembers across calls what the code said: the functions missing between two
// frames (none, mostly), and each function's direct jump targets. It holds no location:
// those of processes gone must go with them.
type tailCache struct {
	gaps  map[gapKey][]tailFunc
	jumps map[tailKey][]uint64
}

func (c *tailCache) reset() {
	c.gaps = make(map[gapKey][]tailFunc)
	c.jumps = make(map[tailKey][]uint64)
}

// tailLocKey is a recovered frame's location within one call: per mapping, as its address
// is.
type tailLocKey struct {
	m     *trace.Mapping
	start uint64
}

// recoverTailCalls puts back the frames tail calls left out of p's samples. A sample it
// changes gets a new Locations slice and no Chunks; the recovered locations are added to
// p.Locations.
func (s *Symbolizer) recoverTailCalls(p *trace.Profile, refs map[*objfile.File]*fileRef) {
	if runtime.GOARCH != "amd64" {
		return
	}
	if s.tails.gaps == nil || len(s.tails.gaps) > maxTailEntries || len(s.tails.jumps) > maxTailEntries {
		s.tails.reset()
	}
	listed := map[*trace.Location]bool{}
	locs := map[tailLocKey]*trace.Location{}
	for _, smp := range p.Samples {
		if smp == nil {
			continue
		}
		var out []*trace.Location // nil until a gap is found
		for i, outer := range smp.Locations {
			if i > 0 {
				if gap := s.tailGap(smp.Locations[i-1], outer, refs, locs); len(gap) > 0 {
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
func (s *Symbolizer) tailGap(inner, outer *trace.Location, refs map[*objfile.File]*fileRef, locs map[tailLocKey]*trace.Location) []*trace.Location {
	if inner == nil || outer == nil || inner.Kind != trace.FrameNative || outer.Kind != trace.FrameNative ||
		outer.Mapping == nil || outer.Mapping.File == nil || inner.Mapping == nil || inner.Mapping.File != outer.Mapping.File {
		return nil
	}
	innerOff, ok1 := inner.FileOffset()
	outerOff, ok2 := outer.FileOffset()
	if !ok1 || !ok2 {
		return nil
	}
	f := outer.Mapping.File
	ref := refs[f]
	if ref == nil {
		id := f.ID()
		ref = &fileRef{id: id, hash: s.fileHash(id)}
		refs[f] = ref
	}
	key := gapKey{file: ref.hash, inner: innerOff, outer: outerOff}
	funcs, ok := s.tails.gaps[key]
	if !ok {
		if fault := mmapfile.Guard(func() { funcs = s.findGap(ref, f, innerOff, outerOff) }); fault != nil {
			funcs = nil
		}
		s.tails.gaps[key] = funcs
	}
	if len(funcs) == 0 {
		return nil
	}
	var gap []*trace.Location
	for _, fn := range funcs {
		k := tailLocKey{m: outer.Mapping, start: fn.start}
		l, ok := locs[k]
		if !ok {
			l = s.tailLocation(ref, outer.Mapping, fn)
			locs[k] = l
		}
		if l != nil {
			gap = append(gap, l)
		}
	}
	return gap
}

// findGap reads the code for the functions missing between the frame at file offset inner
// and its caller's return address at outer, innermost first.
func (s *Symbolizer) findGap(ref *fileRef, f *objfile.File, innerOff, raOff uint64) []tailFunc {
	obj, _ := s.object(ref, f)
	if obj == nil || obj.faulted || len(obj.maps) == 0 || obj.maps[0] == nil || obj.gopcln != nil {
		return nil
	}
	code := obj.maps[0].Bytes()
	if raOff < 5 || raOff > uint64(len(code)) || code[raOff-5] != 0xe8 {
		return nil // not after a direct call
	}
	raVaddr, ok := obj.syms.Vaddr(raOff)
	if !ok {
		return nil
	}
	target := raVaddr + uint64(int64(int32(binary.LittleEndian.Uint32(code[raOff-4:raOff]))))
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
		fn   tailFunc
		prev int
	}
	steps := []step{{fn: tailFunc{callee.Value, callee.Size}, prev: -1}}
	for from, depth := 0, 0; depth < tailDepth; depth++ {
		to := len(steps)
		for i := from; i < to; i++ {
			for _, t := range s.directJumps(ref, obj, code, steps[i].fn) {
				if t == innerSym.Value {
					var chain []tailFunc
					for j := i; j >= 0; j = steps[j].prev {
						chain = append(chain, steps[j].fn)
					}
					return chain // the innermost (the last jump's source) first
				}
				if sym, ok := obj.syms.Funcs.Lookup(t); ok && sym.Value == t {
					steps = append(steps, step{fn: tailFunc{sym.Value, sym.Size}, prev: i})
				}
			}
		}
		from = to
	}
	return nil
}

// directJumps lists the functions fn jumps to directly (E9 rel32 or EB rel8 to a symbol's
// start), scanning its bytes.
func (s *Symbolizer) directJumps(ref *fileRef, obj *objFile, code []byte, fn tailFunc) []uint64 {
	key := tailKey{file: ref.hash, addr: fn.start}
	if jumps, ok := s.tails.jumps[key]; ok {
		return jumps
	}
	var jumps []uint64
	start, ok := obj.syms.FileOffset(fn.start)
	size := min(fn.size, uint64(maxTailScan))
	if ok && size > 0 && start < uint64(len(code)) {
		end := min(start+size, uint64(len(code)))
		for k := start; k+2 <= end; k++ {
			var t uint64
			switch {
			case code[k] == 0xe9 && k+5 <= end:
				t = fn.start + (k - start) + 5 + uint64(int64(int32(binary.LittleEndian.Uint32(code[k+1:k+5]))))
			case code[k] == 0xeb: // a short jump reaches a neighbour
				t = fn.start + (k - start) + 2 + uint64(int64(int8(code[k+1])))
			default:
				continue
			}
			if t >= fn.start && t < fn.start+fn.size {
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

// tailLocation is the location standing for a recovered frame of fn in mapping m, named
// as fn's entry.
func (s *Symbolizer) tailLocation(ref *fileRef, m *trace.Mapping, fn tailFunc) *trace.Location {
	obj, _ := s.object(ref, m.File)
	if obj == nil {
		return nil
	}
	off, ok := obj.syms.FileOffset(fn.start)
	if !ok || off < m.Offset || m.Start+off-m.Offset >= m.End {
		return nil
	}
	lines, source, _ := s.fileLines(ref, m.File, off)
	if len(lines) == 0 {
		return nil
	}
	// The entry's outermost function: what inlining put at its first instruction is not
	// what was called.
	outermost := lines[len(lines)-1]
	return &trace.Location{Kind: trace.FrameNative, Address: m.Start + off - m.Offset, Mapping: m,
		Lines: []trace.Line{outermost}, NameSource: source}
}
