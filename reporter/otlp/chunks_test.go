package otlp

import (
	"fmt"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/trace"
)

// withChunks cuts every sample's locations into root-anchored chunks the way the
// collector does, equal chunks sharing one slice.
func withChunks(p *trace.Profile, size int) *trace.Profile {
	shared := map[string][]*trace.Location{}
	out := *p
	out.Samples = nil
	for _, s := range p.Samples {
		c := *s
		c.Chunks = nil
		for hi := len(s.Locations); hi > 0; hi -= size {
			run := s.Locations[max(hi-size, 0):hi]
			key := fmt.Sprint(run)
			if _, ok := shared[key]; !ok {
				shared[key] = slices.Clone(run)
			}
			c.Chunks = append(c.Chunks, shared[key])
		}
		slices.Reverse(c.Chunks) // leaf chunk first
		out.Samples = append(out.Samples, &c)
	}
	return &out
}

// The per-chunk path must produce exactly what the per-frame path does.
func TestEncodeChunkedEqualsFlat(t *testing.T) {
	p := synthetic(3, 4, 3000, 600, 25, 4, t0)
	flat := Encode([]*trace.Profile{p}, testHost, EncodeOptions{Rand: zeroRand{}})
	chunked := Encode([]*trace.Profile{withChunks(p, 8)}, testHost, EncodeOptions{Rand: zeroRand{}})
	if !proto.Equal(flat, chunked) {
		t.Fatalf("chunked encoding differs: %d vs %d stacks, %d vs %d locations",
			len(flat.Dictionary.StackTable), len(chunked.Dictionary.StackTable),
			len(flat.Dictionary.LocationTable), len(chunked.Dictionary.LocationTable))
	}
}

type zeroRand struct{}

func (zeroRand) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = 1
	}
	return len(b), nil
}
