package encoding

import (
	"bytes"
	"compress/gzip"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// GzipSize is len(b) after gzip at the default level, what OTLP exporters and gRPC's
// gzip compressor use.
func GzipSize(b []byte) int {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b) // a bytes.Buffer does not fail
	zw.Close()
	return buf.Len()
}

var (
	zstdOnce sync.Once
	zstdEnc  *zstd.Encoder
)

// ZstdSize is len(b) after zstd at its default level (3), single-threaded so sizes
// do not depend on the machine.
func ZstdSize(b []byte) int {
	zstdOnce.Do(func() {
		// Options are constants; New fails only on invalid ones.
		zstdEnc, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	})
	return len(zstdEnc.EncodeAll(b, nil))
}
