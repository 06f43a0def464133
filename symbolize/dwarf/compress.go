package dwarf

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
)

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

// openStream opens the decompressed stream of a section's packed bytes, giving the
// compressed pages back as it reads them when release is set. Closing it ends the
// decoder and gives back the rest of what was read.
func openStream(packed []byte, comp compression, size uint64, release func([]byte)) (io.Reader, func(), error) {
	if comp == compZlib {
		f, err := newInflater(packed, release)
		if err != nil {
			return nil, nil, fmt.Errorf("zlib: %w", err)
		}
		return f, f.close, nil
	}
	in := io.Reader(bytes.NewReader(packed))
	done := func() {}
	if release != nil {
		rr := &releasingReader{b: packed, release: release}
		in, done = rr, rr.giveBack // a decoder that knows where its stream ends stops short of EOF
	}
	switch comp {
	case compZstd:
		zr, err := zstdReader(in, size)
		if err != nil {
			return nil, nil, err
		}
		return zr, func() { zr.Close(); done() }, nil
	default:
		return nil, nil, errors.New("unknown compression")
	}
}
