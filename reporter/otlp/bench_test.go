package otlp

import (
	"bytes"
	"compress/gzip"
	"runtime"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/trace"
)

// BenchmarkEncode encodes one interval of 10 000 samples over 2 000 distinct stacks
// about 20 frames deep, from 5 processes, and reports per-sample costs: time,
// allocations, and request size raw and gzipped (as sent).
func BenchmarkEncode(b *testing.B) {
	p := synthetic(7, 5, 10000, 2000, 20, 24, t0)
	b.Run("frames", func(b *testing.B) { benchEncode(b, p) })
	// As the collector delivers them: cut into 8-frame interned chunks.
	b.Run("chunks", func(b *testing.B) { benchEncode(b, withChunks(p, 8)) })
}

func benchEncode(b *testing.B, p *trace.Profile) {
	const samples = 10000
	profiles := []*trace.Profile{p}
	opts := EncodeOptions{Version: "bench"}

	req := Encode(profiles, testHost, opts)
	raw, err := proto.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write(raw)
	w.Close()

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for b.Loop() {
		Encode(profiles, testHost, opts)
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	n := float64(b.N) * samples
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/sample")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/n, "allocs/sample")
	b.ReportMetric(float64(len(raw))/samples, "B/sample")
	b.ReportMetric(float64(gz.Len())/samples, "gzipB/sample")
	b.ReportMetric(float64(len(req.Dictionary.StackTable)-1), "stacks")
	b.ReportMetric(float64(len(req.Dictionary.LocationTable)-1), "locations")
}
