package encoding

import (
	"fmt"
	"slices"

	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// StackTableCodec is encoding (5), what sonde sends today: the OTLP v1development
// dictionary's stack_table, one Stack message per distinct stack, a sample naming it
// by stack_index. It builds the generated messages and marshals them, as sonde's
// reporter does.
func StackTableCodec() Codec {
	return Codec{
		Name:   "stacktable",
		Desc:   "one stack_index into the dictionary's stack_table (OTLP today)",
		New:    func() Encoder { return &stackTableEncoder{stacks: make(map[string]int32)} },
		Decode: decodeStackTable,
	}
}

// StackTableWireCodec writes the same bytes as StackTableCodec with protowire, like
// the experimental encoders: the difference between the two is what the generated
// message objects cost, not what the layout costs.
func StackTableWireCodec() Codec {
	return Codec{
		Name:   "stacktable-wire",
		Desc:   "the same bytes as stacktable, written with protowire",
		New:    func() Encoder { return &stackTableWireEncoder{stacks: make(map[string]int32)} },
		Decode: decodeStackTable,
	}
}

type stackTableEncoder struct {
	stacks map[string]int32
	key    []byte
	// req is kept after Encode: an agent holds the messages while it marshals them.
	req *profilespb.ProfilesData
	out []byte
}

func (e *stackTableEncoder) Encode(c *Corpus) ([]byte, error) {
	clear(e.stacks)
	e.stacks[""] = 0
	table := []*profilespb.Stack{{}}
	// Slabs, as sonde's reporter uses: one allocation for the samples, one for values.
	slab := make([]profilespb.Sample, len(c.Samples))
	values := make([]int64, len(c.Samples))
	samples := make([]*profilespb.Sample, len(c.Samples))
	for i, s := range c.Samples {
		e.key = appendStackKey(e.key[:0], s.Stack)
		si, ok := e.stacks[string(e.key)]
		if !ok {
			si = int32(len(table))
			table = append(table, &profilespb.Stack{LocationIndices: slices.Clone(s.Stack)})
			e.stacks[string(e.key)] = si
		}
		values[i] = s.Count
		slab[i].StackIndex = si
		slab[i].Values = values[i : i+1 : i+1]
		samples[i] = &slab[i]
	}
	d := c.Dict
	e.req = &profilespb.ProfilesData{
		ResourceProfiles: []*profilespb.ResourceProfiles{{
			Resource: &resourcepb.Resource{},
			ScopeProfiles: []*profilespb.ScopeProfiles{{
				Profiles: []*profilespb.Profile{{
					SampleType: &profilespb.ValueType{TypeStrindex: c.samplesStr, UnitStrindex: c.countStr},
					Samples:    samples,
					PeriodType: &profilespb.ValueType{TypeStrindex: c.cpuStr, UnitStrindex: c.nanosStr},
					Period:     c.Period,
				}},
			}},
		}},
		Dictionary: &profilespb.ProfilesDictionary{
			MappingTable:   d.MappingTable,
			LocationTable:  d.LocationTable,
			FunctionTable:  d.FunctionTable,
			LinkTable:      d.LinkTable,
			StringTable:    d.StringTable,
			AttributeTable: d.AttributeTable,
			StackTable:     table,
		},
	}
	var err error
	e.out, err = proto.MarshalOptions{}.MarshalAppend(e.out[:0], e.req)
	if err != nil {
		return nil, fmt.Errorf("encode stack table: %w", err)
	}
	return e.out, nil
}

func appendStackKey(b []byte, stack []int32) []byte {
	for _, l := range stack {
		b = append(b, byte(l), byte(l>>8), byte(l>>16), byte(l>>24))
	}
	return b
}

type stackTableWireEncoder struct {
	stacks  map[string]int32
	key     []byte
	table   []byte // framed Stack messages after the zero one
	body    []byte
	samples []byte
	out     []byte
	env     envelope
	envFor  *Corpus
}

func (e *stackTableWireEncoder) Encode(c *Corpus) ([]byte, error) {
	if e.envFor != c {
		e.env, e.envFor = newEnvelope(c), c
	}
	clear(e.stacks)
	e.stacks[""] = 0
	e.samples = e.samples[:0]
	// stack_table[0], the empty stack, is an empty message.
	e.table = protowire.AppendTag(e.table[:0], fieldDictStackTable, protowire.BytesType)
	e.table = protowire.AppendVarint(e.table, 0)
	next := int32(1)
	for _, s := range c.Samples {
		e.key = appendStackKey(e.key[:0], s.Stack)
		si, ok := e.stacks[string(e.key)]
		if !ok {
			si = next
			next++
			e.stacks[string(e.key)] = si
			e.body = appendPacked(e.body[:0], fieldStackLocations, s.Stack)
			e.table = protowire.AppendTag(e.table, fieldDictStackTable, protowire.BytesType)
			e.table = protowire.AppendBytes(e.table, e.body)
		}
		b := appendUint(e.body[:0], fieldSampleStackIndex, uint64(si))
		b = appendValues(b, s.Count)
		e.body = b
		e.samples = appendSample(e.samples, b)
	}
	out := e.env.appendResourceProfiles(e.out[:0], e.samples)
	var err error
	e.out, err = appendDictionary(out, c.Dict, e.table)
	return e.out, err
}

type stackTableDecoded struct{ pd *profilespb.ProfilesData }

func decodeStackTable(b []byte) (Decoded, error) {
	pd := &profilespb.ProfilesData{}
	if err := proto.Unmarshal(b, pd); err != nil {
		return nil, fmt.Errorf("decode stack table: %w", err)
	}
	return stackTableDecoded{pd}, nil
}

func (d stackTableDecoded) Samples() ([]Sample, error) {
	var out []Sample
	table := d.pd.GetDictionary().GetStackTable()
	for _, rp := range d.pd.ResourceProfiles {
		for _, sp := range rp.ScopeProfiles {
			for _, p := range sp.Profiles {
				for i, s := range p.Samples {
					if s.StackIndex < 0 || int(s.StackIndex) >= len(table) {
						return nil, fmt.Errorf("decode stack table: sample %d names stack %d of %d", i, s.StackIndex, len(table))
					}
					if len(s.Values) != 1 {
						return nil, fmt.Errorf("decode stack table: sample %d has %d values", i, len(s.Values))
					}
					out = append(out, Sample{Stack: slices.Clone(table[s.StackIndex].LocationIndices), Count: s.Values[0]})
				}
			}
		}
	}
	return out, nil
}
