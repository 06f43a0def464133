package otlp

import (
	"bytes"
	stdgzip "compress/gzip"
	"fmt"
	"io"
	"math"
	"runtime"
	"testing"

	"google.golang.org/grpc/encoding"
)

// gzipPayload is an export's worth of bytes that compress about as a profile does: many
// short records, repeated with small differences.
func gzipPayload() []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < 160<<10; i++ {
		fmt.Fprintf(&b, "\x0a\x12func_%d\x10%d\x18%d/usr/lib/x86_64-linux-gnu/libc.so.6", i%701, i%97, i*7919%4093)
	}
	return b.Bytes()
}

func TestGzipIsStateless(t *testing.T) {
	c := encoding.GetCompressor("gzip")
	if _, ok := c.(statelessGzip); !ok {
		t.Fatalf(`the "gzip" compressor is %T, not sonde's`, c)
	}
	in := gzipPayload()
	compress := func() []byte {
		var out bytes.Buffer
		w, err := c.Compress(&out)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(in); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return out.Bytes()
	}
	first := compress()
	if len(first) >= len(in)/2 {
		t.Errorf("%d bytes compressed to %d", len(in), len(first))
	}
	// Any gzip reader reads it, as a collector would.
	r, err := stdgzip.NewReader(bytes.NewReader(first))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, in) {
		t.Fatalf("round trip: %d bytes back of %d, %v", len(got), len(in), err)
	}
	rd, err := c.Decompress(bytes.NewReader(first))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(rd); err != nil || !bytes.Equal(got, in) {
		t.Fatalf("Decompress: %d bytes back of %d, %v", len(got), len(in), err)
	}
	// An export after the collector emptied every pool allocates what it needs anew:
	// well below compress/gzip's default writer, which is what grpc's own gzip pools.
	// The least of a few tries: whatever else the process allocates meanwhile only adds.
	allocated := func(f func()) uint64 {
		least := uint64(math.MaxUint64)
		for range 5 {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.GC()
			runtime.ReadMemStats(&before)
			f()
			runtime.ReadMemStats(&after)
			least = min(least, after.TotalAlloc-before.TotalAlloc)
		}
		return least
	}
	ours := allocated(func() { compress() })
	std := allocated(func() {
		w := stdgzip.NewWriter(io.Discard)
		w.Write(in)
		w.Close()
	})
	t.Logf("allocated per export: %d KB; compress/gzip's default: %d KB", ours>>10, std>>10)
	if ours >= std/2 {
		t.Errorf("an export allocates %d KB, compress/gzip %d KB", ours>>10, std>>10)
	}
}
