package flame

import (
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/trace"
)

// bigProfile has about nodes distinct call-tree nodes: stacks down to 40 deep over a
// few thousand functions, with a heavy-tailed spread of counts, as a busy host gives.
func bigProfile(nodes int) *trace.Profile {
	r := rand.New(rand.NewPCG(1, 2))
	fns := make([]*trace.Location, 3000)
	for i := range fns {
		fns[i] = &trace.Location{Kind: trace.FrameNative, Lines: []trace.Line{{
			Function: fmt.Sprintf("namespace::Class%d::method%d(int, std::string const&)", i/10, i), File: fmt.Sprintf("src/file%d.cc", i/20), Line: int64(i)}}}
	}
	p := &trace.Profile{Start: time.Unix(0, 0), End: time.Unix(60, 0), Period: time.Second / 19, Locations: fns}
	procs := []*trace.Process{{PID: 1, Name: "a"}, {PID: 2, Name: "b"}, {PID: 3, Name: "c"}}
	var stack []*trace.Location
	for n := 0; n < nodes; {
		// Each sample keeps a prefix of the previous stack, then branches: a tree.
		keep := r.IntN(len(stack) + 1)
		stack = stack[:keep]
		for len(stack) < 3+r.IntN(38) {
			stack = append(stack, fns[r.IntN(len(fns))])
			n++
		}
		locs := make([]*trace.Location, len(stack))
		for i, l := range stack {
			locs[len(stack)-1-i] = l
		}
		p.Samples = append(p.Samples, &trace.Sample{Process: procs[r.IntN(len(procs))], Count: 1 + int64(r.ExpFloat64()*20), Locations: locs})
	}
	return p
}

func BenchmarkWriteHTML(b *testing.B) {
	p := bigProfile(100_000)
	b.Logf("%d samples", len(p.Samples))
	for b.Loop() {
		if err := WriteHTML(io.Discard, p, FactsFrom(p)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWriteSVG(b *testing.B) {
	p := bigProfile(100_000)
	for b.Loop() {
		if err := WriteSVG(io.Discard, p, FactsFrom(p)); err != nil {
			b.Fatal(err)
		}
	}
}
