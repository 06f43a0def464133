package encoding

import (
	"fmt"

	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Field numbers of the v1development messages the envelope is made of, and of the
// experimental fields. The experimental tables sit in ProfilesData beside the
// dictionary rather than inside it so the dictionary's bytes stay identical across
// encodings and parse with the generated code; a real proposal would put them in
// ProfilesDictionary, where free field numbers also take one-byte tags.
const (
	fieldDataResourceProfiles = 1
	fieldDataDictionary       = 2
	fieldDataLocationIndices  = 3 // slices, chunked: OTEP 239's location_indices
	fieldDataTreeLocations    = 4 // calltree_location_indices
	fieldDataTreeParents      = 5 // calltree_parent_indices

	fieldResourceResource = 1
	fieldResourceScopes   = 2
	fieldScopeProfiles    = 2

	fieldProfileSampleType = 1
	fieldProfileSamples    = 2
	fieldProfilePeriodType = 5
	fieldProfilePeriod     = 6

	fieldValueTypeType = 1
	fieldValueTypeUnit = 2

	fieldDictStackTable = 7
	fieldStackLocations = 1

	fieldSampleStackIndex = 1 // v1development
	fieldSampleValues     = 4 // v1development
	// The experimental sample fields take the first free numbers, one-byte tags as
	// OTEP 239's locations_start_index (7) and locations_length (8) had; calltree_index
	// reuses the first.
	fieldSampleStart    = 6
	fieldSampleLength   = 7
	fieldSampleCalltree = 6
)

// envelope writes what every OTLP-shaped encoding shares: ProfilesData with one
// ResourceProfiles, ScopeProfiles and Profile around the samples, and the dictionary.
type envelope struct {
	header, trailer []byte // the profile's fields before and after the samples
}

func newEnvelope(c *Corpus) envelope {
	var e envelope
	e.header = appendValueType(e.header, fieldProfileSampleType, c.samplesStr, c.countStr)
	e.trailer = appendValueType(e.trailer, fieldProfilePeriodType, c.cpuStr, c.nanosStr)
	if c.Period != 0 {
		e.trailer = protowire.AppendTag(e.trailer, fieldProfilePeriod, protowire.VarintType)
		e.trailer = protowire.AppendVarint(e.trailer, uint64(c.Period))
	}
	return e
}

func appendValueType(b []byte, num protowire.Number, typ, unit int32) []byte {
	var body [2 * (1 + binaryVarintMax)]byte
	m := body[:0]
	if typ != 0 {
		m = protowire.AppendTag(m, fieldValueTypeType, protowire.VarintType)
		m = protowire.AppendVarint(m, uint64(typ))
	}
	if unit != 0 {
		m = protowire.AppendTag(m, fieldValueTypeUnit, protowire.VarintType)
		m = protowire.AppendVarint(m, uint64(unit))
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, m)
}

const binaryVarintMax = 10

// appendResourceProfiles wraps samples (each already framed as Profile field 2) in
// ResourceProfiles{resource: {}, scope_profiles: [{profiles: [profile]}]}, the bytes
// proto.Marshal writes for the same messages.
func (e envelope) appendResourceProfiles(out, samples []byte) []byte {
	profile := len(e.header) + len(samples) + len(e.trailer)
	scope := 1 + protowire.SizeVarint(uint64(profile)) + profile
	resource := 2 + 1 + protowire.SizeVarint(uint64(scope)) + scope
	out = protowire.AppendTag(out, fieldDataResourceProfiles, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(resource))
	out = protowire.AppendTag(out, fieldResourceResource, protowire.BytesType)
	out = protowire.AppendVarint(out, 0)
	out = protowire.AppendTag(out, fieldResourceScopes, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(scope))
	out = protowire.AppendTag(out, fieldScopeProfiles, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(profile))
	out = append(out, e.header...)
	out = append(out, samples...)
	return append(out, e.trailer...)
}

// appendDictionary appends ProfilesData.dictionary: the corpus dictionary as
// proto.Marshal writes it, followed by extra, already-framed dictionary fields
// (stack_table), which sort after the generated ones.
func appendDictionary(out []byte, dict *profilespb.ProfilesDictionary, extra []byte) ([]byte, error) {
	n := proto.Size(dict)
	out = protowire.AppendTag(out, fieldDataDictionary, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(n+len(extra)))
	var err error
	out, err = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(out, dict)
	if err != nil {
		return nil, fmt.Errorf("marshal dictionary: %w", err)
	}
	return append(out, extra...), nil
}

// appendPacked appends a packed repeated varint field, nothing when v is empty, as
// proto3 omits it.
func appendPacked(b []byte, num protowire.Number, v []int32) []byte {
	if len(v) == 0 {
		return b
	}
	n := 0
	for _, x := range v {
		n += protowire.SizeVarint(uint64(x))
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	for _, x := range v {
		b = protowire.AppendVarint(b, uint64(x))
	}
	return b
}

// appendUint appends a varint field, nothing when v is zero (proto3's default).
func appendUint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// appendSample frames a sample body as Profile.samples.
func appendSample(b []byte, body []byte) []byte {
	b = protowire.AppendTag(b, fieldProfileSamples, protowire.BytesType)
	return protowire.AppendBytes(b, body)
}

// appendValues appends Sample.values = [count].
func appendValues(b []byte, count int64) []byte {
	b = protowire.AppendTag(b, fieldSampleValues, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(protowire.SizeVarint(uint64(count))))
	return protowire.AppendVarint(b, uint64(count))
}

// wireData is what the protowire decoders keep of a message: the dictionary as
// generated messages (parsed alike for every encoding), and flat arrays for samples
// and the stack tables, so a decode costs a fixed handful of allocations beyond the
// dictionary's.
type wireData struct {
	Dict *profilespb.ProfilesDictionary
	// Per sample.
	Values []int64
	Start  []int32 // slices: start; calltree: node; chunked: first ref in RefStart
	Length []int32 // slices: length; chunked: number of refs
	// chunked: all samples' (start, length) references, concatenated.
	RefStart, RefLength []int32
	// Tables.
	LocationIndices []int32 // slices, chunked
	TreeLocations   []int32 // calltree
	TreeParents     []int32 // calltree, absolute or delta-coded
}

// sampleFunc decodes one sample body into d.
type sampleFunc func(d *wireData, body []byte) error

// decodeWire parses the envelope and tables that the protowire encoders write,
// handing each sample body to sample.
func decodeWire(b []byte, sample sampleFunc) (*wireData, error) {
	d := &wireData{}
	// Count samples first so the per-sample arrays are allocated once.
	n, err := countSamples(b)
	if err != nil {
		return nil, err
	}
	d.Values = make([]int64, 0, n)
	d.Start = make([]int32, 0, n)
	d.Length = make([]int32, 0, n)
	err = walk(b, func(num protowire.Number, v []byte) error {
		switch num {
		case fieldDataResourceProfiles:
			return walkProfiles(v, func(p []byte) error {
				return walk(p, func(num protowire.Number, v []byte) error {
					if num == fieldProfileSamples {
						return sample(d, v)
					}
					return nil
				})
			})
		case fieldDataDictionary:
			d.Dict = &profilespb.ProfilesDictionary{}
			if err := proto.Unmarshal(v, d.Dict); err != nil {
				return fmt.Errorf("dictionary: %w", err)
			}
		case fieldDataLocationIndices:
			d.LocationIndices, err = unpack(v)
			return err
		case fieldDataTreeLocations:
			d.TreeLocations, err = unpack(v)
			return err
		case fieldDataTreeParents:
			d.TreeParents, err = unpack(v)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if d.Dict == nil {
		return nil, fmt.Errorf("decode: no dictionary")
	}
	return d, nil
}

func countSamples(b []byte) (int, error) {
	n := 0
	err := walk(b, func(num protowire.Number, v []byte) error {
		if num != fieldDataResourceProfiles {
			return nil
		}
		return walkProfiles(v, func(p []byte) error {
			return walk(p, func(num protowire.Number, _ []byte) error {
				if num == fieldProfileSamples {
					n++
				}
				return nil
			})
		})
	})
	return n, err
}

// walkProfiles calls f with each Profile of a ResourceProfiles.
func walkProfiles(rp []byte, f func([]byte) error) error {
	return walk(rp, func(num protowire.Number, v []byte) error {
		if num != fieldResourceScopes {
			return nil
		}
		return walk(v, func(num protowire.Number, v []byte) error {
			if num != fieldScopeProfiles {
				return nil
			}
			return f(v)
		})
	})
}

// walk calls f with the number and bytes of each length-delimited field of a message
// and skips the others: the envelope's scalars are the encoder's constants.
func walk(b []byte, f func(protowire.Number, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			if err := f(num, v); err != nil {
				return err
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return protowire.ParseError(m)
		}
		b = b[m:]
	}
	return nil
}

// walkSample calls scalar for each varint field and packed for each length-delimited
// one of a sample body.
func walkSample(b []byte, scalar func(protowire.Number, uint64), packed func(protowire.Number, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch typ {
		case protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			scalar(num, v)
			b = b[m:]
		case protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			if err := packed(num, v); err != nil {
				return err
			}
			b = b[m:]
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			b = b[m:]
		}
	}
	return nil
}

// unpack decodes a packed varint array in one allocation.
func unpack(b []byte) ([]int32, error) {
	n := 0
	for _, c := range b {
		if c < 0x80 {
			n++
		}
	}
	out := make([]int32, 0, n)
	return appendUnpacked(out, b)
}

func appendUnpacked(out []int32, b []byte) ([]int32, error) {
	for len(b) > 0 {
		v, m := protowire.ConsumeVarint(b)
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		out = append(out, int32(v))
		b = b[m:]
	}
	return out, nil
}

// firstVarint reads the single element of a packed field such as values = [count].
func firstVarint(b []byte) (uint64, error) {
	v, m := protowire.ConsumeVarint(b)
	if m < 0 {
		return 0, protowire.ParseError(m)
	}
	return v, nil
}
