package gopclntab

import (
	"encoding/binary"
	"os/exec"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testprog"
)

// FuzzTable feeds mutated pclntabs to the decoder and probes the result: corrupt
// offsets, varints and inline trees must end in an error or a miss, never a panic
// or a hang. The inline trees are read from the table's own bytes here.
func FuzzTable(f *testing.F) {
	f.Add([]byte{0xf1, 0xff, 0xff, 0xff, 0, 0, 1, 8}, uint64(0x401000))
	if _, err := exec.LookPath("go"); err == nil {
		ef, tab := load(f, testprog.BuildGo(f, testprog.GoInlining, "-ldflags=-s -w"))
		data, err := ef.Section(".gopclntab").Data()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, tab.text)
	}
	f.Fuzz(func(t *testing.T, data []byte, text uint64) {
		if len(data) < 8 {
			return
		}
		tab := &Table{order: binary.LittleEndian, go120: binary.LittleEndian.Uint32(data) == magic120, text: text}
		if tab.parseHeader(data) != nil {
			return
		}
		probe := func() {
			for i := range min(tab.nfunc, 64) {
				fn, ok := tab.funcAt(i)
				if !ok {
					continue
				}
				for _, pc := range []uint64{fn.entry, fn.entry + 1, fn.entry + 17, fn.entry + 1000} {
					if frames := tab.Lookup(pc); len(frames) > maxInlineDepth+1 {
						t.Fatalf("Lookup(%#x): %d frames", pc, len(frames))
					}
				}
			}
		}
		// The trees copied, as from a file read into memory…
		tab.readInlineTreesFrom(func(off uint64, n int) ([]byte, bool) {
			if off > uint64(len(data)) || uint64(len(data))-off < uint64(n) {
				return nil, false
			}
			return data[off : off+uint64(n)], true
		}, 0)
		probe()
		// …and read in place, as from a mapped file whose memory data is.
		tab.inl, tab.inlIndex = nil, nil
		tab.mem = &image{file: data, segs: []segment{{filesz: uint64(len(data))}}, order: binary.LittleEndian}
		probe()
	})
}
