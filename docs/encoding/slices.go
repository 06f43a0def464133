package encoding

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
)

// SlicesCodec is encoding (2): OTEP 239's shared location_indices, each sample naming
// one (locations_start_index, locations_length) slice of it.
//
// The encoder reuses a slice whenever the stack already appears in the table as a
// root-anchored tail, that is, as a whole earlier stack or the caller part of one
// (leaf first, "main;a" is the tail of "main;a;b"). That is the sharing start/length
// was designed for; an encoder that shares only identical stacks writes the same bytes
// as a stack table without its per-stack message framing.
func SlicesCodec() Codec {
	return Codec{
		Name:   "slices",
		Desc:   "one start/length into shared location_indices (OTEP 239)",
		New:    func() Encoder { return &slicesEncoder{tails: make(map[uint64]int32)} },
		Decode: decodeSlices,
	}
}

type slicesEncoder struct {
	li []int32
	// tails maps the hash of every root-anchored tail written to li to where it starts.
	tails        map[uint64]int32
	body, out    []byte
	samples      []byte
	env          envelope
	envFor       *Corpus
	hits, misses int
}

func (e *slicesEncoder) Encode(c *Corpus) ([]byte, error) {
	if e.envFor != c {
		e.env, e.envFor = newEnvelope(c), c
	}
	clear(e.tails)
	e.li = e.li[:0]
	e.samples = e.samples[:0]
	e.hits, e.misses = 0, 0
	for _, s := range c.Samples {
		start := e.find(s.Stack)
		if start < 0 {
			start = e.add(s.Stack)
			e.misses++
		} else {
			e.hits++
		}
		b := appendValues(e.body[:0], s.Count)
		b = appendUint(b, fieldSampleStart, uint64(start))
		b = appendUint(b, fieldSampleLength, uint64(len(s.Stack)))
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

// find returns where stack already sits in li, or -1.
func (e *slicesEncoder) find(stack []int32) int {
	if len(stack) == 0 {
		return 0
	}
	h := uint64(hashSeed)
	for i := len(stack) - 1; i >= 0; i-- {
		h = hashStep(h, stack[i])
	}
	start, ok := e.tails[h]
	if !ok || int(start)+len(stack) > len(e.li) || !slices.Equal(e.li[start:int(start)+len(stack)], stack) {
		return -1
	}
	return int(start)
}

// add appends stack to li and remembers each of its root-anchored tails.
func (e *slicesEncoder) add(stack []int32) int {
	start := len(e.li)
	e.li = append(e.li, stack...)
	h := uint64(hashSeed)
	for i := len(stack) - 1; i >= 0; i-- {
		h = hashStep(h, stack[i])
		if _, ok := e.tails[h]; !ok {
			e.tails[h] = int32(start + i)
		}
	}
	return start
}

type slicesDecoded struct{ *wireData }

func decodeSlices(b []byte) (Decoded, error) {
	d, err := decodeWire(b, func(d *wireData, body []byte) error {
		var count, start, length uint64
		err := walkSample(body, func(num protowire.Number, v uint64) {
			switch num {
			case fieldSampleStart:
				start = v
			case fieldSampleLength:
				length = v
			}
		}, func(num protowire.Number, v []byte) error {
			if num == fieldSampleValues {
				var err error
				count, err = firstVarint(v)
				return err
			}
			return nil
		})
		d.Values = append(d.Values, int64(count))
		d.Start = append(d.Start, int32(start))
		d.Length = append(d.Length, int32(length))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("slices: %w", err)
	}
	return slicesDecoded{d}, nil
}

func (d slicesDecoded) Samples() ([]Sample, error) {
	out := make([]Sample, len(d.Values))
	for i := range out {
		start, n := int(d.Start[i]), int(d.Length[i])
		if start < 0 || n < 0 || start+n > len(d.LocationIndices) {
			return nil, fmt.Errorf("slices: sample %d reaches %d of %d location indices", i, start+n, len(d.LocationIndices))
		}
		out[i] = Sample{Stack: slices.Clone(d.LocationIndices[start : start+n]), Count: d.Values[i]}
	}
	return out, nil
}
