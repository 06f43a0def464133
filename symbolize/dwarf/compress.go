package dwarf

import (
	"fmt"
	"io"

	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

func zlibReader(packed io.Reader) (io.Reader, error) {
	r, err := zlib.NewReader(packed)
	if err != nil {
		return nil, fmt.Errorf("zlib: %w", err)
	}
	return r, nil
}

type zstdStream struct{ *zstd.Decoder }

func (z zstdStream) Close() { z.Decoder.Close() }

// zstdReader decodes a zstd section of size bytes; the decoder's own buffers are
// bounded by the section, and it runs in the calling goroutine only.
func zstdReader(packed io.Reader, size uint64) (zstdStream, error) {
	d, err := zstd.NewReader(packed,
		zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxMemory(max(size, 1<<20)))
	if err != nil {
		return zstdStream{}, fmt.Errorf("zstd: %w", err)
	}
	return zstdStream{d}, nil
}
