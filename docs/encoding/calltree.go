package encoding

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// CalltreeCodec is encoding (4), the parent-index tree of the discussion: two parallel
// arrays hold one node per distinct (parent node, location), and a sample names the
// node of its leaf. Node 0 is the empty stack, the tree's root, so parents are never
// negative: the discussion's -1 for "no parent" would cost ten bytes as an int64
// varint.
//
// With delta set, a node's parent is written as the distance back to it (node -
// parent, at least 1 because a parent is always created first). Nodes of a new stack
// are created root to leaf one after another, so most distances are 1: the same tree
// in fewer bytes and far more compressible ones.
func CalltreeCodec(delta bool) Codec {
	name, desc := "calltree", "one node index into a (parent, location) tree"
	if delta {
		name, desc = "calltree-delta", "calltree with parents written as distances back"
	}
	return Codec{
		Name: name,
		Desc: desc,
		New: func() Encoder {
			return &calltreeEncoder{delta: delta, nodes: make(map[uint64]int32)}
		},
		Decode: func(b []byte) (Decoded, error) { return decodeCalltree(b, delta) },
	}
}

// treeKey packs (parent, location) in a uint64, which Go maps hash on a fast path.
func treeKey(parent, loc int32) uint64 { return uint64(uint32(parent))<<32 | uint64(uint32(loc)) }

type calltreeEncoder struct {
	delta         bool
	nodes         map[uint64]int32
	parents, locs []int32
	written       []int32 // parents as written: absolute or delta
	body, out     []byte
	samples       []byte
	env           envelope
	envFor        *Corpus
}

func (e *calltreeEncoder) Encode(c *Corpus) ([]byte, error) {
	if e.envFor != c {
		e.env, e.envFor = newEnvelope(c), c
	}
	clear(e.nodes)
	e.parents = append(e.parents[:0], 0)
	e.locs = append(e.locs[:0], 0)
	e.samples = e.samples[:0]
	for _, s := range c.Samples {
		node := e.node(s.Stack)
		b := appendValues(e.body[:0], s.Count)
		b = appendUint(b, fieldSampleCalltree, uint64(node))
		e.body = b
		e.samples = appendSample(e.samples, b)
	}
	out := e.env.appendResourceProfiles(e.out[:0], e.samples)
	out, err := appendDictionary(out, c.Dict, nil)
	if err != nil {
		return nil, err
	}
	out = appendPacked(out, fieldDataTreeLocations, e.locs)
	parents := e.parents
	if e.delta {
		e.written = append(e.written[:0], 0)
		for i := 1; i < len(e.parents); i++ {
			e.written = append(e.written, int32(i)-e.parents[i])
		}
		parents = e.written
	}
	e.out = appendPacked(out, fieldDataTreeParents, parents)
	return e.out, nil
}

// node walks stack from the root, adding the nodes the tree lacks, and returns its
// leaf's node.
func (e *calltreeEncoder) node(stack []int32) int32 {
	var node int32
	for i := len(stack) - 1; i >= 0; i-- {
		k := treeKey(node, stack[i])
		child, ok := e.nodes[k]
		if !ok {
			child = int32(len(e.parents))
			e.parents = append(e.parents, node)
			e.locs = append(e.locs, stack[i])
			e.nodes[k] = child
		}
		node = child
	}
	return node
}

type calltreeDecoded struct{ *wireData }

func decodeCalltree(b []byte, delta bool) (Decoded, error) {
	d, err := decodeWire(b, func(d *wireData, body []byte) error {
		var count, node uint64
		err := walkSample(body, func(num protowire.Number, v uint64) {
			if num == fieldSampleCalltree {
				node = v
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
		d.Start = append(d.Start, int32(node))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("calltree: %w", err)
	}
	if len(d.TreeParents) != len(d.TreeLocations) {
		return nil, fmt.Errorf("calltree: %d parents for %d nodes", len(d.TreeParents), len(d.TreeLocations))
	}
	if delta {
		// Back to absolute indices in place: the receiver's tree is the same.
		for i := 1; i < len(d.TreeParents); i++ {
			d.TreeParents[i] = int32(i) - d.TreeParents[i]
		}
	}
	for i := 1; i < len(d.TreeParents); i++ {
		// Parents come first; that also rules out cycles when walking up.
		if p := d.TreeParents[i]; p < 0 || int(p) >= i {
			return nil, fmt.Errorf("calltree: node %d has parent %d", i, p)
		}
	}
	return calltreeDecoded{d}, nil
}

func (d calltreeDecoded) Samples() ([]Sample, error) {
	out := make([]Sample, len(d.Values))
	for i := range out {
		node := d.Start[i]
		if node < 0 || int(node) >= len(d.TreeParents) {
			return nil, fmt.Errorf("calltree: sample %d names node %d of %d", i, node, len(d.TreeParents))
		}
		var stack []int32
		for ; node != 0; node = d.TreeParents[node] {
			stack = append(stack, d.TreeLocations[node])
		}
		out[i] = Sample{Stack: stack, Count: d.Values[i]}
	}
	return out, nil
}
