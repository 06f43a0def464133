package otlp

import (
	"io"

	"github.com/klauspost/compress/gzip"
	"google.golang.org/grpc/encoding"
	// grpc's own gzip registers first, as a dependency of this package, so that
	// statelessGzip replaces it rather than the other way round.
	_ "google.golang.org/grpc/encoding/gzip"
)

// statelessGzip is the "gzip" of sonde's gRPC requests. grpc's own pools compress/gzip
// writers at the default level, about 800 KB each, which the garbage collector drops
// and the next interval's export allocates again: a megabyte or more of an idle agent's
// heap, for an export every few seconds. This one keeps no state between exports: each
// request is one Write (rawCodec marshals a request into one buffer), compressed on its
// own in a few kilobytes of pooled buffers, four times faster than the default level and
// a sixth larger (a host's 160 KB interval: 65 KB against 56 KB).
type statelessGzip struct{}

func init() { encoding.RegisterCompressor(statelessGzip{}) }

func (statelessGzip) Name() string { return "gzip" }

func (statelessGzip) Compress(w io.Writer) (io.WriteCloser, error) {
	return gzip.NewWriterLevel(w, gzip.StatelessCompression)
}

// Decompress reads a collector's compressed responses, which are small.
func (statelessGzip) Decompress(r io.Reader) (io.Reader, error) {
	return gzip.NewReader(r)
}
