package dwarf

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkNewUnits is the C library's part of naming beside an exec storm: each pass
// brings a few units not seen before, scattered through the file, whose sections are
// decompressed from the marks before them, decoded, and let go at the pass's end.
func BenchmarkNewUnits(b *testing.B) {
	path, ef := openLibcDebug(b)
	m := mapFile(b, path)
	c := NewCache(64 << 20)
	t, err := Load(ef, Options{File: m.Bytes(), Release: m.Release, Cache: c})
	if err != nil {
		b.Fatal(err)
	}
	defer t.Close()
	var firsts []uint64
	seen := map[uint32]bool{}
	for _, sp := range t.spans {
		if !seen[sp.unit] {
			seen[sp.unit] = true
			firsts = append(firsts, sp.lo)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const perPass = 3
	before := c.Decompressed().TotalBytes
	for b.Loop() {
		addrs := make([]uint64, perPass)
		for i := range addrs {
			addrs[i] = firsts[rng.IntN(len(firsts))]
		}
		if err := t.Prepare(addrs); err != nil {
			b.Fatal(err)
		}
		for _, a := range addrs {
			if _, err := t.Lookup(a); err != nil {
				b.Fatal(err)
			}
		}
		t.Thin()
		c.Shed()
	}
	b.ReportMetric(float64(c.Decompressed().TotalBytes-before)/float64(b.N)/perPass, "B/unit")
}
