package dwarf

import (
	"bytes"
	stdzlib "compress/zlib"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/zlib"
)

// inflateInputs are streams of every kind of block: stored, fixed and dynamic codes,
// matches reaching back a whole window and overlapping themselves, from two encoders.
func inflateInputs(t testing.TB) map[string][]byte {
	rng := rand.New(rand.NewPCG(3, 4))
	text := make([]byte, 0, 3<<20)
	for len(text) < cap(text)-64 {
		switch rng.IntN(4) {
		case 0: // noise: stored or barely coded
			for range rng.IntN(2000) {
				text = append(text, byte(rng.Uint32()))
			}
		case 1: // a run: a match overlapping itself
			b := byte(rng.Uint32())
			for range rng.IntN(1000) {
				text = append(text, b)
			}
		case 2: // a repeat from far back
			if len(text) > window {
				from := len(text) - window + rng.IntN(100)
				text = append(text, text[from:from+rng.IntN(300)]...)
			}
		default: // words, like DWARF's strings and small numbers
			text = fmt.Appendf(text, "DW_TAG_subprogram %d name_%x ", rng.IntN(50), rng.IntN(4096))
		}
	}
	in := map[string][]byte{}
	for _, level := range []int{zlib.NoCompression, zlib.HuffmanOnly, zlib.BestSpeed, zlib.DefaultCompression, zlib.BestCompression} {
		var b bytes.Buffer
		w, err := zlib.NewWriterLevel(&b, level)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(text)
		w.Close()
		in[fmt.Sprintf("klauspost-%d", level)] = b.Bytes()
	}
	for _, level := range []int{1, 9} {
		var b bytes.Buffer
		w, _ := stdzlib.NewWriterLevel(&b, level)
		// Small writes with flushes: short blocks, some of fixed codes, empty stored ones.
		for i := 0; i < len(text); i += 5000 {
			w.Write(text[i:min(i+5000, len(text))])
			if i%(5000*7) == 0 {
				w.Flush()
			}
		}
		w.Close()
		in[fmt.Sprintf("stdlib-%d", level)] = b.Bytes()
	}
	in["plain"] = text
	return in
}

// The inflater decodes what zlib encoders write, and started again at any block it
// passed, from the history it saw there, it goes on with the same bytes.
func TestInflateMatchesZlib(t *testing.T) {
	in := inflateInputs(t)
	plain := in["plain"]
	for name, packed := range in {
		if name == "plain" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			f, err := newInflater(packed, nil)
			if err != nil {
				t.Fatal(err)
			}
			type block struct {
				bit, out uint64
				hist     []byte
			}
			var marks []block
			f.onBlock = func(bit, out uint64, hist []byte) *refWatch {
				marks = append(marks, block{bit: bit, out: out, hist: bytes.Clone(hist)})
				return nil
			}
			got, err := io.ReadAll(f)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, plain) {
				t.Fatalf("decoded %d bytes, not the %d encoded", len(got), len(plain))
			}
			if len(marks) < 3 {
				t.Fatalf("%d blocks seen", len(marks))
			}
			for _, i := range []int{1, len(marks) / 2, len(marks) - 1} {
				m := marks[i]
				replay := min(len(m.hist), 100)
				r, err := resumeInflater(packed, m.bit, m.out, m.hist, replay, nil)
				if err != nil {
					t.Fatal(err)
				}
				rest, err := io.ReadAll(r)
				if err != nil {
					t.Fatalf("from block %d: %v", i, err)
				}
				if from := m.out - uint64(replay); !bytes.Equal(rest, plain[from:]) {
					t.Fatalf("from block %d at %d: %d bytes differ from the stream's", i, m.out, len(rest))
				}
			}
		})
	}
}

// Broken streams fail with an error: cut short, a checksum that does not match, bits
// that are no code.
func TestInflateRejects(t *testing.T) {
	packed := inflateInputs(t)["klauspost--1"]
	read := func(b []byte) error {
		f, err := newInflater(b, nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, f)
		return err
	}
	if err := read(packed[:len(packed)/2]); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("half a stream: %v", err)
	}
	bad := bytes.Clone(packed)
	bad[len(bad)-1] ^= 1
	if err := read(bad); !errors.Is(err, errZlibChecksum) {
		t.Errorf("a checksum changed: %v", err)
	}
	if err := read([]byte{0x78, 0x9c, 0xff, 0xff, 0xff}); err == nil {
		t.Error("a block of the reserved type decoded")
	}
	if err := read([]byte{0x12, 0x34}); !errors.Is(err, errZlibHeader) {
		t.Errorf("no zlib header: %v", err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 2000 {
		b := bytes.Clone(packed[:4096])
		b[2+rng.IntN(len(b)-2)] ^= byte(1 << rng.IntN(8))
		read(b) // must return, whatever it says
	}
}

// FuzzInflate decodes hostile streams: what zlib decodes, the inflater decodes alike.
func FuzzInflate(f *testing.F) {
	for _, b := range inflateInputs(f) {
		if len(b) > 0 && b[0] == 0x78 {
			f.Add(b[:min(len(b), 2000)])
		}
	}
	// Whole small streams of each kind of block, for the fuzzer to bend.
	for _, level := range []int{zlib.NoCompression, zlib.HuffmanOnly, zlib.BestSpeed, zlib.BestCompression} {
		var small bytes.Buffer
		w, _ := zlib.NewWriterLevel(&small, level)
		w.Write([]byte("abcabcabcabcabc DW_AT_name DW_AT_name\x00\x01\x02 DW_TAG_subprogram DW_AT_name"))
		w.Close()
		f.Add(small.Bytes())
	}
	f.Add([]byte{0x78, 0x01, 0x4b, 0x4c, 0x4a, 0x06, 0x00, 0x02, 0x4d, 0x01, 0x27}) // "abc", fixed codes
	f.Fuzz(func(t *testing.T, b []byte) {
		fi, err := newInflater(b, nil)
		var mine []byte
		var mineErr error = err
		if err == nil {
			mine, mineErr = io.ReadAll(io.LimitReader(fi, 1<<20))
		}
		zr, err := zlib.NewReader(bytes.NewReader(b))
		if err != nil {
			return
		}
		theirs, theirErr := io.ReadAll(io.LimitReader(zr, 1<<20))
		if theirErr == nil && (mineErr != nil || !bytes.Equal(mine, theirs)) {
			t.Fatalf("zlib decodes %d bytes; the inflater %d, %v", len(theirs), len(mine), mineErr)
		}
		if mineErr == nil && !bytes.Equal(mine, theirs) {
			t.Fatalf("the inflater decodes %d bytes; zlib %d, %v", len(mine), len(theirs), theirErr)
		}
	})
}

func BenchmarkInflate(b *testing.B) {
	packed := inflateInputs(b)["klauspost--1"]
	plain := len(inflateInputs(b)["plain"])
	b.Run("inflater", func(b *testing.B) {
		b.SetBytes(int64(plain))
		for b.Loop() {
			f, _ := newInflater(packed, nil)
			io.Copy(io.Discard, f)
		}
	})
	b.Run("klauspost", func(b *testing.B) {
		b.SetBytes(int64(plain))
		for b.Loop() {
			r, _ := zlib.NewReader(bytes.NewReader(packed))
			io.Copy(io.Discard, r)
		}
	})
}

// Codes longer than the root table's bits decode through subtables: bytes of a
// geometric spread, coded by Huffman alone, take codes of up to 15 bits.
func TestInflateLongCodes(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	plain := make([]byte, 1<<20)
	for i := range plain {
		b := 0
		for b < 40 && rng.IntN(3) != 0 {
			b++
		}
		plain[i] = byte(b)
	}
	var zb bytes.Buffer
	zw, _ := stdzlib.NewWriterLevel(&zb, stdzlib.HuffmanOnly)
	zw.Write(plain)
	zw.Close()
	f, err := newInflater(zb.Bytes(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	long := 0
	f.onBlock = func(uint64, uint64, []byte) *refWatch { long += len(f.dyn[0].sub); return nil }
	got, err := io.ReadAll(f)
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("decoded %d bytes (%v), not the %d encoded", len(got), err, len(plain))
	}
	if long == 0 {
		t.Error("no block had codes longer than the root table's")
	}
}
