package encoding

import (
	"runtime"
	"testing"
)

// BenchmarkEncode encodes each corpus with each codec, reporting besides time and
// allocations the message size raw, gzipped and zstd'ed, and peak-B: what a fresh
// encoder holds once its first request is written (see retainedBytes).
//
//	go test -run '^$' -bench . ./docs/encoding
func BenchmarkEncode(b *testing.B) {
	for _, c := range loadCorpora(b) {
		for _, codec := range Codecs() {
			b.Run(c.Name+"/"+codec.Name, func(b *testing.B) {
				benchEncode(b, c, codec)
			})
		}
	}
}

// BenchmarkChunkSize is the chunked encoding's sweep over chunk and LRU sizes.
func BenchmarkChunkSize(b *testing.B) {
	for _, c := range loadCorpora(b) {
		for _, k := range []int{4, 8, 16} {
			codec := ChunkedCodec(k, DefaultLRUSize)
			b.Run(c.Name+"/"+codec.Name, func(b *testing.B) {
				benchEncode(b, c, codec)
			})
		}
	}
}

func benchEncode(b *testing.B, c *Corpus, codec Codec) {
	m, err := measureEncode(c, codec)
	if err != nil {
		b.Fatal(err)
	}
	// One request first: the agent's encoder is long-lived, so what counts is a
	// request's cost once its buffers and maps have grown.
	enc := codec.New()
	if _, err := enc.Encode(c); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := enc.Encode(c); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(m.Bytes), "B")
	b.ReportMetric(float64(m.Gzip), "gzip-B")
	b.ReportMetric(float64(m.Zstd), "zstd-B")
	b.ReportMetric(float64(m.Peak), "peak-B")
}

// BenchmarkDecode parses each encoding into the form its receiver keeps (generated
// messages for pprof and the stack table, flat arrays beside the generated dictionary
// for the experimental layouts), reporting live-B: what the parsed form holds.
func BenchmarkDecode(b *testing.B) {
	for _, c := range loadCorpora(b) {
		for _, codec := range Codecs() {
			b.Run(c.Name+"/"+codec.Name, func(b *testing.B) {
				benchDecode(b, c, codec)
			})
		}
	}
}

func benchDecode(b *testing.B, c *Corpus, codec Codec) {
	msg, err := codec.New().Encode(c)
	if err != nil {
		b.Fatal(err)
	}
	msg = append([]byte(nil), msg...)
	live := retainedBytes(func() any {
		d, err := codec.Decode(msg)
		if err != nil {
			b.Fatal(err)
		}
		return d
	})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := codec.Decode(msg); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(live), "live-B")
}

// encodeSizes is one encoding of one corpus, measured.
type encodeSizes struct {
	Bytes, Gzip, Zstd int
	// Stack is what the stack representation costs: Bytes less the size of the same
	// encoding of the corpus with every stack emptied.
	Stack int
	// Peak is the live heap a fresh encoder holds after writing the corpus.
	Peak uint64
}

func measureEncode(c *Corpus, codec Codec) (encodeSizes, error) {
	var m encodeSizes
	out, err := codec.New().Encode(c)
	if err != nil {
		return m, err
	}
	m.Bytes, m.Gzip, m.Zstd = len(out), GzipSize(out), ZstdSize(out)
	empty, err := codec.New().Encode(c.withoutStacks())
	if err != nil {
		return m, err
	}
	m.Stack = m.Bytes - len(empty)
	m.Peak = retainedBytes(func() any {
		enc := codec.New()
		out, err := enc.Encode(c)
		if err != nil {
			panic(err) // encoded once above already
		}
		return []any{enc, out}
	})
	return m, nil
}

// withoutStacks is c with every sample's stack emptied, sharing the dictionary.
func (c *Corpus) withoutStacks() *Corpus {
	e := *c
	e.Samples = make([]Sample, len(c.Samples))
	for i, s := range c.Samples {
		e.Samples[i] = Sample{Count: s.Count}
	}
	return &e
}

// retainedBytes is the live heap that what f returns keeps, measured as the growth of
// HeapAlloc across f between two collections. For the encoders, whose tables, maps
// and buffers only grow while they write a request, that is their peak, short of the
// garbage that growing a slice leaves behind (at most as much again as the slice).
// Shared inputs (the corpus, its dictionary in generated or pprof objects) are built
// before and not counted.
func retainedBytes(f func() any) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	keep := f()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(keep)
	if after.HeapAlloc < before.HeapAlloc {
		return 0
	}
	return after.HeapAlloc - before.HeapAlloc
}
