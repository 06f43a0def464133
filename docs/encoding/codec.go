package encoding

import (
	"fmt"
	"slices"
)

// Encoder turns a corpus into the bytes of one request. It keeps its state (tables,
// maps, the LRU, the output buffer) from call to call, as an agent's long-lived
// encoder would, so steady-state allocations are what the benchmarks see; the
// returned bytes are valid until the next call.
type Encoder interface {
	Encode(c *Corpus) ([]byte, error)
}

// Decoded is a message parsed into the form a receiver keeps.
type Decoded interface {
	// Samples expands every sample's stack back into location indices, leaf first.
	Samples() ([]Sample, error)
}

// Codec is one encoding under study.
type Codec struct {
	Name string
	// Desc says in a few words how a sample names its stack.
	Desc   string
	New    func() Encoder
	Decode func([]byte) (Decoded, error)
}

// Default parameters of the chunked encoding; docs/encoding.md has the sweep behind
// them.
const (
	DefaultChunkSize = 16
	DefaultLRUSize   = 1024
)

// Codecs are the encodings of the study, in the order of its tables.
func Codecs() []Codec {
	return []Codec{
		PprofCodec(),
		SlicesCodec(),
		ChunkedCodec(DefaultChunkSize, DefaultLRUSize),
		CalltreeCodec(false),
		CalltreeCodec(true),
		StackTableCodec(),
		StackTableWireCodec(),
	}
}

// Equal reports how decoded samples differ from the corpus's, nil when they do not.
func Equal(c *Corpus, got []Sample) error {
	if len(got) != len(c.Samples) {
		return fmt.Errorf("%d samples, want %d", len(got), len(c.Samples))
	}
	for i, s := range c.Samples {
		if got[i].Count != s.Count {
			return fmt.Errorf("sample %d: count %d, want %d", i, got[i].Count, s.Count)
		}
		if !slices.Equal(got[i].Stack, s.Stack) {
			return fmt.Errorf("sample %d: stack %v, want %v", i, got[i].Stack, s.Stack)
		}
	}
	return nil
}

// hashStep folds one location into a running chunk or tail hash. A collision only
// costs a missed reuse: every hit is verified against the table it points into.
func hashStep(h uint64, loc int32) uint64 {
	h ^= uint64(uint32(loc))
	h *= 0x9e3779b97f4a7c15
	return h ^ h>>29
}

const hashSeed = 0xcbf29ce484222325
