package encoding

import (
	"fmt"
	"slices"

	"github.com/sonde-profiler/sonde/internal/lru"
	"google.golang.org/protobuf/encoding/protowire"
)

// ChunkedCodec is encoding (3), the proposal of the "location references in sample"
// discussion: locations_start_index and locations_length become repeated, a stack is
// cut into chunks of chunkSize locations, and a hash-LRU of lruSize chunks remembers
// where each recently written chunk sits in location_indices so later stacks point at
// it instead of repeating it.
//
// Chunks are anchored at the root end (only the leaf-most chunk is short), so stacks
// that share callers share whole chunks whatever their depth. References that happen
// to be adjacent in location_indices are merged, so a stack written for the first time
// costs one (start, length) pair, not one per chunk. The LRU is emptied per request:
// its values point into that request's location_indices.
func ChunkedCodec(chunkSize, lruSize int) Codec {
	chunkSize, lruSize = max(chunkSize, 1), max(lruSize, 1)
	return Codec{
		Name: fmt.Sprintf("chunked/%d", chunkSize),
		Desc: fmt.Sprintf("repeated start/length over %d-location chunks, %d-entry hash-LRU", chunkSize, lruSize),
		New: func() Encoder {
			return &chunkedEncoder{k: chunkSize, lru: lru.New[uint64, int32](lruSize)}
		},
		Decode: decodeChunked,
	}
}

type chunkedEncoder struct {
	k   int
	lru *lru.LRU[uint64, int32]
	li  []int32
	// starts and lengths are one sample's references, reused.
	starts, lengths []int32
	body, out       []byte
	samples         []byte
	env             envelope
	envFor          *Corpus
	// Chunks reused and written in the last Encode, and (start, length) pairs it
	// wrote; collisions are hash hits whose contents differed.
	hits, misses, collisions, nrefs int
}

func (e *chunkedEncoder) Encode(c *Corpus) ([]byte, error) {
	if e.envFor != c {
		e.env, e.envFor = newEnvelope(c), c
	}
	e.lru.Purge()
	e.li = e.li[:0]
	e.samples = e.samples[:0]
	e.hits, e.misses, e.collisions, e.nrefs = 0, 0, 0, 0
	for _, s := range c.Samples {
		e.refs(s.Stack)
		e.nrefs += len(e.starts)
		b := appendValues(e.body[:0], s.Count)
		b = appendPacked(b, fieldSampleStart, e.starts)
		b = appendPacked(b, fieldSampleLength, e.lengths)
		e.body = b
		e.samples = appendSample(e.samples, b)
	}
	out := e.env.appendResourceProfiles(e.out[:0], e.samples)
	out, err := appendDictionary(out, c.Dict, nil)
	if err != nil {
		return nil, err
	}
	e.out = appendPacked(out, fieldDataLocationIndices, e.li)
	return e.out, nil
}

// refs fills starts and lengths with the chunks of stack, leaf first.
func (e *chunkedEncoder) refs(stack []int32) {
	e.starts, e.lengths = e.starts[:0], e.lengths[:0]
	first := len(stack) % e.k
	if first == 0 {
		first = e.k
	}
	for lo, hi := 0, first; lo < len(stack); lo, hi = hi, hi+e.k {
		chunk := stack[lo:hi]
		h := uint64(hashSeed)
		for _, l := range chunk {
			h = hashStep(h, l)
		}
		start, ok := e.lru.Get(h)
		switch {
		case ok && int(start)+len(chunk) <= len(e.li) && slices.Equal(e.li[start:int(start)+len(chunk)], chunk):
			e.hits++
		default:
			if ok {
				e.collisions++
			}
			start = int32(len(e.li))
			e.li = append(e.li, chunk...)
			e.lru.Add(h, start)
			e.misses++
		}
		if n := len(e.starts); n > 0 && e.starts[n-1]+e.lengths[n-1] == start {
			e.lengths[n-1] += int32(len(chunk))
			continue
		}
		e.starts = append(e.starts, start)
		e.lengths = append(e.lengths, int32(len(chunk)))
	}
}

type chunkedDecoded struct{ *wireData }

func decodeChunked(b []byte) (Decoded, error) {
	d, err := decodeWire(b, func(d *wireData, body []byte) error {
		var count uint64
		first := int32(len(d.RefStart))
		err := walkSample(body, func(protowire.Number, uint64) {}, func(num protowire.Number, v []byte) error {
			var err error
			switch num {
			case fieldSampleValues:
				count, err = firstVarint(v)
			case fieldSampleStart:
				d.RefStart, err = appendUnpacked(d.RefStart, v)
			case fieldSampleLength:
				d.RefLength, err = appendUnpacked(d.RefLength, v)
			}
			return err
		})
		if len(d.RefStart) != len(d.RefLength) {
			return fmt.Errorf("sample %d: %d starts, %d lengths", len(d.Values), len(d.RefStart)-int(first), len(d.RefLength)-int(first))
		}
		d.Values = append(d.Values, int64(count))
		d.Start = append(d.Start, first)
		d.Length = append(d.Length, int32(len(d.RefStart))-first)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("chunked: %w", err)
	}
	return chunkedDecoded{d}, nil
}

func (d chunkedDecoded) Samples() ([]Sample, error) {
	out := make([]Sample, len(d.Values))
	for i := range out {
		var stack []int32
		for r := d.Start[i]; r < d.Start[i]+d.Length[i]; r++ {
			start, n := int(d.RefStart[r]), int(d.RefLength[r])
			if start < 0 || n < 0 || start+n > len(d.LocationIndices) {
				return nil, fmt.Errorf("chunked: sample %d reaches %d of %d location indices", i, start+n, len(d.LocationIndices))
			}
			stack = append(stack, d.LocationIndices[start:start+n]...)
		}
		out[i] = Sample{Stack: stack, Count: d.Values[i]}
	}
	return out, nil
}
