package dwarf

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// Decompressing a section gives back the compressed pages as the stream passes them,
// not at the end: the compressed and the decompressed copy of a large section (2.4 MB
// and 5.5 MB of libc's .debug_info) are not resident together.
func TestDecompressReleasesAsItReads(t *testing.T) {
	plain := make([]byte, 3<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range plain {
		plain[i] = byte(rng.IntN(16)) // compresses to about half
	}
	var zb bytes.Buffer
	zw := zlib.NewWriter(&zb)
	zw.Write(plain)
	zw.Close()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	zs := enc.EncodeAll(plain, nil)
	enc.Close()
	for _, tc := range []struct {
		name   string
		packed []byte
		comp   compression
	}{{"zlib", zb.Bytes(), compZlib}, {"zstd", zs, compZstd}} {
		t.Run(tc.name, func(t *testing.T) {
			var calls, covered int
			var readAtFirst int
			release := func(b []byte) {
				off := cap(tc.packed) - cap(b) // b is a slice of packed
				if off != covered {
					t.Errorf("release at %d, want %d: ranges must follow one another", off, covered)
				}
				covered = off + len(b)
				if calls == 0 {
					readAtFirst = covered
				}
				calls++
			}
			scratch, err := decompress(tc.packed, tc.comp, uint64(len(plain)), release)
			if err != nil {
				t.Fatal(err)
			}
			defer scratch.Close()
			if !bytes.Equal(scratch.Bytes(), plain) {
				t.Fatal("decompressed bytes differ")
			}
			if covered < len(tc.packed)*9/10 {
				t.Errorf("released %d of %d compressed bytes", covered, len(tc.packed))
			}
			if calls < 3 || readAtFirst > len(tc.packed)/2 {
				t.Errorf("%d releases, the first after %d of %d bytes: not given back as read", calls, readAtFirst, len(tc.packed))
			}
		})
	}
}
