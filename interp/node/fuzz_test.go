package node

import (
	"testing"
)

// FuzzHeap reads V8 objects out of arbitrary memory: a process's memory can hold anything,
// and reading it must end in a name or an error, never a panic or an unbounded read.
func FuzzHeap(f *testing.F) {
	f.Add([]byte{0x03, 0x34, 0x4f, 0x64}, uint16(8), uint16(2))
	f.Fuzz(func(t *testing.T, mem []byte, at, pcAt uint16) {
		if len(mem) > 1<<16 {
			return
		}
		fh := &fakeHeap{base: 0x10000000, mem: mem, maps: map[int64]uint64{}}
		for _, md := range []*Metadata{&node20, &node22} {
			h := &heap{m: fh, md: md}
			obj := fh.base + uint64(at)
			h.sfi(obj, h.script)
			h.jitFrames(fh.base+uint64(pcAt), true)
			h.str(obj, maxString)
		}
		decodePositions(mem)
		codeRange(mem, [2]uint64{fh.base, fh.base + 4096})
	})
}
