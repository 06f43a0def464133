package otlp

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/profiles/v1development"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/trace"
)

// sameAsProto checks that MarshalRequest writes exactly the bytes proto.Marshal does,
// whatever room it starts with.
func sameAsProto(t *testing.T, what string, req *collectorpb.ExportProfilesServiceRequest) {
	t.Helper()
	want, err := proto.Marshal(req)
	if err != nil {
		t.Fatalf("%s: proto.Marshal: %v", what, err)
	}
	for _, hint := range []int{0, 1, len(want), 4 * len(want)} {
		got, err := marshalRequest(req, hint, 0)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s, hint %d: %d bytes differ from proto.Marshal's %d (first difference at %d)",
				what, hint, len(got), len(want), firstDiff(got, want))
		}
		if cap(got) > len(got)+len(got)/8+512 {
			t.Errorf("%s, hint %d: %d bytes hold %d of room", what, hint, len(got), cap(got))
		}
	}
	// And the same bytes read back as a profiles file.
	var data profilespb.ProfilesData
	if err := proto.Unmarshal(want, &data); err != nil || !proto.Equal(&data, profilesData(req)) {
		t.Fatalf("%s: the request's bytes are not its ProfilesData (%v)", what, err)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// Requests as sonde builds them: the fixture's interval (kernel frames, inlined lines,
// links, timestamps) and a large synthetic one, whole and as Split cuts it.
func TestMarshalRequestAsEncoded(t *testing.T) {
	f := newFixture()
	sameAsProto(t, "fixture", Encode([]*trace.Profile{f.profile}, testHost, EncodeOptions{Rand: zeroRand{}}))
	sameAsProto(t, "fixture with timestamps", Encode([]*trace.Profile{f.profile}, testHost, EncodeOptions{Timestamps: true}))
	big := Encode([]*trace.Profile{synthetic(7, 5, 10000, 2000, 20, 24, t0)}, testHost, EncodeOptions{Version: "test"})
	sameAsProto(t, "synthetic", big)
	parts := Split(big, proto.Size(big)/3)
	if len(parts) < 3 {
		t.Fatalf("split into %d parts", len(parts))
	}
	for _, p := range parts {
		sameAsProto(t, "part", p)
	}
	sameAsProto(t, "empty", &collectorpb.ExportProfilesServiceRequest{})
}

// Every field of every message, with values at the edges of their encodings (zero,
// negative int32s that take ten bytes, oneofs set to zero values, empty and nil elements
// of repeated fields), in random shapes.
func TestMarshalRequestEveryField(t *testing.T) {
	for seed := range uint64(300) {
		g := wireGen{r: rand.New(rand.NewPCG(seed, 45))}
		sameAsProto(t, "random request", g.request())
	}
}

// A string that is not UTF-8 fails the request, as it fails proto.Marshal, wherever it is.
func TestMarshalRequestRefusesNonUTF8(t *testing.T) {
	bad := "app\xff"
	reqs := []*collectorpb.ExportProfilesServiceRequest{
		{Dictionary: &profilespb.ProfilesDictionary{StringTable: []string{"", bad}}},
		{ResourceProfiles: []*profilespb.ResourceProfiles{{Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{
			{Key: "process.executable.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: bad}}}}}}}},
		{ResourceProfiles: []*profilespb.ResourceProfiles{{SchemaUrl: bad}}},
	}
	for i, req := range reqs {
		if _, err := proto.Marshal(req); err == nil {
			t.Fatalf("request %d: proto.Marshal took it", i)
		}
		if b, err := MarshalRequest(req); !errors.Is(err, errNotUTF8) {
			t.Errorf("request %d: %d bytes, error %v; want errNotUTF8", i, len(b), err)
		}
	}
}

// With a limit, a request up to it is written whole and one byte over is refused, from
// whatever room it starts with.
func TestMarshalRequestLimit(t *testing.T) {
	req := Encode([]*trace.Profile{newFixture().profile}, testHost, EncodeOptions{Rand: zeroRand{}})
	want, _ := MarshalRequest(req)
	for _, hint := range []int{0, len(want) - 1, len(want), 2 * len(want)} {
		if got, err := marshalRequest(req, hint, len(want)); err != nil || !bytes.Equal(got, want) {
			t.Errorf("hint %d, limit %d: %d bytes, %v", hint, len(want), len(got), err)
		}
		for _, limit := range []int{len(want) - 1, 100} {
			if got, err := marshalRequest(req, hint, limit); !errors.Is(err, errTooBig) || got != nil {
				t.Errorf("hint %d, limit %d: %d bytes, %v; want errTooBig", hint, limit, len(got), err)
			}
		}
	}
}

type wireGen struct{ r *rand.Rand }

func (g wireGen) n(most int) int { return g.r.IntN(most + 1) }

func (g wireGen) str() string {
	switch g.n(3) {
	case 0:
		return ""
	case 1:
		return "é\x00" // bytes as they are: proto3 strings are not checked on the way out
	}
	return string(bytes.Repeat([]byte{'s'}, g.n(200)))
}

func (g wireGen) bytes() []byte {
	if g.n(2) == 0 {
		return nil
	}
	b := make([]byte, g.n(20))
	for i := range b {
		b[i] = byte(g.r.Uint32())
	}
	return b
}

func (g wireGen) i32() int32 {
	switch g.n(4) {
	case 0:
		return 0
	case 1:
		return -1 - int32(g.n(1000))
	case 2:
		return math.MaxInt32
	}
	return int32(g.n(300))
}

func (g wireGen) i64() int64 {
	switch g.n(3) {
	case 0:
		return 0
	case 1:
		return math.MinInt64 + int64(g.n(5))
	}
	return g.r.Int64()
}

func (g wireGen) u64() uint64 {
	if g.n(2) == 0 {
		return 0
	}
	return g.r.Uint64() >> g.n(63)
}

func (g wireGen) i32s() []int32 {
	v := make([]int32, g.n(4))
	for i := range v {
		v[i] = g.i32()
	}
	return v
}

func (g wireGen) strs() []string {
	v := make([]string, g.n(3))
	for i := range v {
		v[i] = g.str()
	}
	return v
}

// list makes up to max elements, some of them nil.
func list[M any](g wireGen, most int, mk func() *M) []*M {
	v := make([]*M, g.n(most))
	for i := range v {
		if g.n(9) > 0 {
			v[i] = mk()
		}
	}
	return v
}

func maybe[M any](g wireGen, mk func() *M) *M {
	if g.n(3) == 0 {
		return nil
	}
	return mk()
}

func (g wireGen) anyValue(depth int) *commonpb.AnyValue {
	v := &commonpb.AnyValue{}
	k := g.n(8)
	if depth > 2 && (k == 5 || k == 6) {
		k = 1
	}
	switch k {
	case 0: // unset
	case 1:
		v.Value = &commonpb.AnyValue_StringValue{StringValue: g.str()}
	case 2:
		v.Value = &commonpb.AnyValue_BoolValue{BoolValue: g.n(1) == 1}
	case 3:
		v.Value = &commonpb.AnyValue_IntValue{IntValue: g.i64()}
	case 4:
		v.Value = &commonpb.AnyValue_DoubleValue{DoubleValue: []float64{0, math.Copysign(0, -1), 1.5, math.Inf(-1)}[g.n(3)]}
	case 5:
		v.Value = &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{
			Values: list(g, 3, func() *commonpb.AnyValue { return g.anyValue(depth + 1) })}}
	case 6:
		v.Value = &commonpb.AnyValue_KvlistValue{KvlistValue: &commonpb.KeyValueList{
			Values: list(g, 3, func() *commonpb.KeyValue { return g.keyValue(depth + 1) })}}
	case 7:
		v.Value = &commonpb.AnyValue_BytesValue{BytesValue: g.bytes()}
	case 8:
		v.Value = &commonpb.AnyValue_StringValueStrindex{StringValueStrindex: g.i32()}
	}
	return v
}

func (g wireGen) keyValue(depth int) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: g.str(), KeyStrindex: g.i32(),
		Value: maybe(g, func() *commonpb.AnyValue { return g.anyValue(depth) })}
}

func (g wireGen) keyValues() []*commonpb.KeyValue {
	return list(g, 3, func() *commonpb.KeyValue { return g.keyValue(0) })
}

func (g wireGen) valueType() *profilespb.ValueType {
	return &profilespb.ValueType{TypeStrindex: g.i32(), UnitStrindex: g.i32()}
}

func (g wireGen) request() *collectorpb.ExportProfilesServiceRequest {
	return &collectorpb.ExportProfilesServiceRequest{
		ResourceProfiles: list(g, 3, g.resourceProfiles),
		Dictionary:       maybe(g, g.dictionary),
	}
}

func (g wireGen) resourceProfiles() *profilespb.ResourceProfiles {
	return &profilespb.ResourceProfiles{
		Resource: maybe(g, func() *resourcepb.Resource {
			return &resourcepb.Resource{
				Attributes:             g.keyValues(),
				DroppedAttributesCount: uint32(g.u64()),
				EntityRefs: list(g, 2, func() *commonpb.EntityRef {
					return &commonpb.EntityRef{SchemaUrl: g.str(), Type: g.str(), IdKeys: g.strs(), DescriptionKeys: g.strs()}
				}),
			}
		}),
		ScopeProfiles: list(g, 2, func() *profilespb.ScopeProfiles {
			return &profilespb.ScopeProfiles{
				Scope: maybe(g, func() *commonpb.InstrumentationScope {
					return &commonpb.InstrumentationScope{Name: g.str(), Version: g.str(),
						Attributes: g.keyValues(), DroppedAttributesCount: uint32(g.u64())}
				}),
				Profiles:  list(g, 2, g.profile),
				SchemaUrl: g.str(),
			}
		}),
		SchemaUrl: g.str(),
	}
}

func (g wireGen) profile() *profilespb.Profile {
	return &profilespb.Profile{
		SampleType: maybe(g, g.valueType),
		Samples: list(g, 4, func() *profilespb.Sample {
			s := &profilespb.Sample{StackIndex: g.i32(), AttributeIndices: g.i32s(), LinkIndex: g.i32()}
			for range g.n(3) {
				s.Values = append(s.Values, g.i64())
			}
			for range g.n(3) {
				s.TimestampsUnixNano = append(s.TimestampsUnixNano, g.u64())
			}
			return s
		}),
		TimeUnixNano:           g.u64(),
		DurationNano:           g.u64(),
		PeriodType:             maybe(g, g.valueType),
		Period:                 g.i64(),
		ProfileId:              g.bytes(),
		DroppedAttributesCount: uint32(g.u64()),
		OriginalPayloadFormat:  g.str(),
		OriginalPayload:        g.bytes(),
		AttributeIndices:       g.i32s(),
	}
}

func (g wireGen) dictionary() *profilespb.ProfilesDictionary {
	return &profilespb.ProfilesDictionary{
		MappingTable: list(g, 3, func() *profilespb.Mapping {
			return &profilespb.Mapping{MemoryStart: g.u64(), MemoryLimit: g.u64(), FileOffset: g.u64(),
				FilenameStrindex: g.i32(), AttributeIndices: g.i32s()}
		}),
		LocationTable: list(g, 4, func() *profilespb.Location {
			return &profilespb.Location{MappingIndex: g.i32(), Address: g.u64(), AttributeIndices: g.i32s(),
				Lines: list(g, 3, func() *profilespb.Line {
					return &profilespb.Line{FunctionIndex: g.i32(), Line: g.i64(), Column: g.i64()}
				})}
		}),
		FunctionTable: list(g, 3, func() *profilespb.Function {
			return &profilespb.Function{NameStrindex: g.i32(), SystemNameStrindex: g.i32(),
				FilenameStrindex: g.i32(), StartLine: g.i64()}
		}),
		LinkTable: list(g, 2, func() *profilespb.Link {
			return &profilespb.Link{TraceId: g.bytes(), SpanId: g.bytes()}
		}),
		StringTable: g.strs(),
		AttributeTable: list(g, 3, func() *profilespb.KeyValueAndUnit {
			return &profilespb.KeyValueAndUnit{KeyStrindex: g.i32(), UnitStrindex: g.i32(),
				Value: maybe(g, func() *commonpb.AnyValue { return g.anyValue(0) })}
		}),
		StackTable: list(g, 3, func() *profilespb.Stack { return &profilespb.Stack{LocationIndices: g.i32s()} }),
	}
}

// A collector's responses read as proto.Unmarshal reads them, unknown fields skipped,
// and what is not protobuf refused.
func TestUnmarshalResponse(t *testing.T) {
	full, _ := proto.Marshal(&collectorpb.ExportProfilesServiceResponse{
		PartialSuccess: &collectorpb.ExportProfilesPartialSuccess{RejectedProfiles: 7, ErrorMessage: "too old"}})
	// A newer collector's fields, before and inside the partial success.
	unknown := protowire.AppendTag(nil, 9, protowire.BytesType)
	unknown = protowire.AppendString(unknown, "x")
	unknown = protowire.AppendTag(unknown, 10, protowire.Fixed32Type)
	unknown = protowire.AppendFixed32(unknown, 1)
	inner := protowire.AppendTag(nil, 3, protowire.VarintType)
	inner = protowire.AppendVarint(inner, 5)
	inner = protowire.AppendTag(inner, 1, protowire.VarintType)
	inner = protowire.AppendVarint(inner, 3)
	withUnknown := append(unknown, protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), inner)...)
	for _, b := range [][]byte{nil, full, withUnknown, append(full, withUnknown...)} {
		var want, got collectorpb.ExportProfilesServiceResponse
		if err := proto.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		got.PartialSuccess = &collectorpb.ExportProfilesPartialSuccess{ErrorMessage: "stale"}
		if err := unmarshalResponse(b, &got); err != nil {
			t.Fatalf("%x: %v", b, err)
		}
		if got.GetPartialSuccess().GetRejectedProfiles() != want.GetPartialSuccess().GetRejectedProfiles() ||
			got.GetPartialSuccess().GetErrorMessage() != want.GetPartialSuccess().GetErrorMessage() ||
			(got.PartialSuccess == nil) != (want.PartialSuccess == nil) {
			t.Errorf("%x: read %v, proto reads %v", b, &got, &want)
		}
	}
	for _, bad := range [][]byte{{0x0a}, {0x0a, 0x05, 0x08}, {0x08}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}} {
		var got collectorpb.ExportProfilesServiceResponse
		if err := unmarshalResponse(bad, &got); !errors.Is(err, errResponse) {
			t.Errorf("%x: %v, want errResponse", bad, err)
		}
	}
}
