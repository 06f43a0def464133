package otlp

import (
	"errors"
	"fmt"
	"math"
	"unicode/utf8"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/profiles/v1development"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/encoding/protowire"
)

// MarshalRequest returns req in protobuf wire form, the bytes proto.Marshal returns for
// it. Every interval's export goes through here; proto.Marshal walks the messages by
// reflection, and its code (google.golang.org/protobuf/internal/impl and the
// descriptors behind it) was 0.4 MB of sonde's resident code beside the side-by-side
// workloads for no other use. The request is the shape of ProfilesData too: the same
// bytes are a profiles file.
//
// The fields of the v1development profiles protocol (v0.4.0) and of the common and
// resource messages (proto v1.11) are all written, in proto.Marshal's order; unknown
// fields are not, as sonde builds its messages and never reads one off the wire.
//
// As with proto.Marshal, a string that is not UTF-8 is an error: a collector would
// refuse the whole request.
func MarshalRequest(req *collectorpb.ExportProfilesServiceRequest) ([]byte, error) {
	return marshalRequest(req, 0, 0)
}

// errTooBig is a request that grew past the limit it was marshaled with.
var errTooBig = errors.New("request over the size limit")

// marshalRequest is MarshalRequest with room for hint bytes from the start (the size of
// the last request, say), so that the buffer need not grow on the way. With a limit
// above 0 it gives up with errTooBig once the request is larger: an interval too big for
// one request costs at most twice the limit before it is split, not its whole size.
func marshalRequest(req *collectorpb.ExportProfilesServiceRequest, hint, limit int) (out []byte, err error) {
	size := max(hint, 512)
	if limit > 0 {
		size = min(size, limit)
	}
	w := wireWriter{buf: make([]byte, size), limit: limit}
	w.off = len(w.buf)
	defer func() {
		// room stops a request over the limit from deep in the messages; nothing else
		// panics here on purpose.
		if p := recover(); p != nil {
			if p != errTooBig {
				panic(p)
			}
			out, err = nil, errTooBig
		}
	}()
	w.request(req)
	if w.err != nil {
		return nil, w.err
	}
	out = w.buf[w.off:]
	if w.off > len(w.buf)/8 {
		// Requests are queued until sent: keep what they hold, not the room left over.
		out = append([]byte(nil), out...)
	}
	return out, nil
}

// errNotUTF8 is a string field holding something else than UTF-8.
var errNotUTF8 = errors.New("string field is not valid UTF-8")

// wireWriter writes protobuf backwards, from the end of buf towards its start: a
// message's fields in reverse order, each nested message before its length and tag,
// which are then known. One pass, and no sizes computed ahead of the bytes.
type wireWriter struct {
	buf   []byte
	off   int   // the bytes written are buf[off:]
	err   error // the first string that was not UTF-8
	limit int   // above 0, the most bytes written before room panics with errTooBig
}

// written is how many bytes have been written so far.
func (w *wireWriter) written() int { return len(w.buf) - w.off }

// room makes space for n more bytes in front of those written.
func (w *wireWriter) room(n int) {
	if w.off >= n {
		return
	}
	size := 2*len(w.buf) + n
	if w.limit > 0 {
		// Never room for more than the limit, so that every write past it comes here.
		if w.written()+n > w.limit {
			panic(errTooBig)
		}
		size = min(size, w.limit)
	}
	buf := make([]byte, size)
	off := size - w.written()
	copy(buf[off:], w.buf[w.off:])
	w.buf, w.off = buf, off
}

func (w *wireWriter) varint(v uint64) {
	n := protowire.SizeVarint(v)
	w.room(n)
	w.off -= n
	protowire.AppendVarint(w.buf[w.off:w.off], v)
}

func (w *wireWriter) tag(num protowire.Number, typ protowire.Type) {
	w.varint(protowire.EncodeTag(num, typ))
}

func (w *wireWriter) raw(b []byte) {
	w.room(len(b))
	w.off -= len(b)
	copy(w.buf[w.off:], b)
}

// str writes a string field's bytes, which must be UTF-8.
func (w *wireWriter) str(s string) {
	if w.err == nil && !utf8.ValidString(s) {
		w.err = fmt.Errorf("%w: %q", errNotUTF8, s)
	}
	w.room(len(s))
	w.off -= len(s)
	copy(w.buf[w.off:], s)
}

func (w *wireWriter) fixed64(v uint64) {
	w.room(8)
	w.off -= 8
	protowire.AppendFixed64(w.buf[w.off:w.off], v)
}

// closeLen ends a length-delimited field whose content began when start bytes had been
// written.
func (w *wireWriter) closeLen(num protowire.Number, start int) {
	w.varint(uint64(w.written() - start))
	w.tag(num, protowire.BytesType)
}

// The fields below are proto3 fields with implicit presence: written only when not zero.

func (w *wireWriter) uint64Field(num protowire.Number, v uint64) {
	if v != 0 {
		w.varint(v)
		w.tag(num, protowire.VarintType)
	}
}

// int32Field writes an int32 as protobuf does: negative values sign-extended to 64 bits.
func (w *wireWriter) int32Field(num protowire.Number, v int32) {
	w.uint64Field(num, uint64(int64(v)))
}

func (w *wireWriter) int64Field(num protowire.Number, v int64) { w.uint64Field(num, uint64(v)) }

func (w *wireWriter) fixed64Field(num protowire.Number, v uint64) {
	if v != 0 {
		w.fixed64(v)
		w.tag(num, protowire.Fixed64Type)
	}
}

func (w *wireWriter) stringField(num protowire.Number, s string) {
	if s != "" {
		w.str(s)
		w.varint(uint64(len(s)))
		w.tag(num, protowire.BytesType)
	}
}

func (w *wireWriter) bytesField(num protowire.Number, b []byte) {
	if len(b) > 0 {
		w.raw(b)
		w.varint(uint64(len(b)))
		w.tag(num, protowire.BytesType)
	}
}

// Repeated fields: every element is written, an empty string or message too.

func (w *wireWriter) strings(num protowire.Number, ss []string) {
	for i := len(ss) - 1; i >= 0; i-- {
		w.str(ss[i])
		w.varint(uint64(len(ss[i])))
		w.tag(num, protowire.BytesType)
	}
}

func (w *wireWriter) packedInt32(num protowire.Number, vs []int32) {
	if len(vs) == 0 {
		return
	}
	start := w.written()
	for i := len(vs) - 1; i >= 0; i-- {
		w.varint(uint64(int64(vs[i])))
	}
	w.closeLen(num, start)
}

func (w *wireWriter) packedInt64(num protowire.Number, vs []int64) {
	if len(vs) == 0 {
		return
	}
	start := w.written()
	for i := len(vs) - 1; i >= 0; i-- {
		w.varint(uint64(vs[i]))
	}
	w.closeLen(num, start)
}

func (w *wireWriter) packedFixed64(num protowire.Number, vs []uint64) {
	if len(vs) == 0 {
		return
	}
	start := w.written()
	for i := len(vs) - 1; i >= 0; i-- {
		w.fixed64(vs[i])
	}
	w.closeLen(num, start)
}

// message writes a nested message as field num with write writing its fields. A nil
// message is not written when singular; in a repeated field it is written empty, as
// proto.Marshal does.
func message[M any](w *wireWriter, num protowire.Number, m *M, write func(*wireWriter, *M)) {
	start := w.written()
	if m != nil {
		write(w, m)
	}
	w.closeLen(num, start)
}

func optional[M any](w *wireWriter, num protowire.Number, m *M, write func(*wireWriter, *M)) {
	if m != nil {
		message(w, num, m, write)
	}
}

func repeated[M any](w *wireWriter, num protowire.Number, ms []*M, write func(*wireWriter, *M)) {
	for i := len(ms) - 1; i >= 0; i-- {
		message(w, num, ms[i], write)
	}
}

// The messages, each with its fields from the last number to the first.

func (w *wireWriter) request(r *collectorpb.ExportProfilesServiceRequest) {
	optional(w, 2, r.Dictionary, (*wireWriter).dictionary)
	repeated(w, 1, r.ResourceProfiles, (*wireWriter).resourceProfiles)
}

func (w *wireWriter) resourceProfiles(r *profilespb.ResourceProfiles) {
	w.stringField(3, r.SchemaUrl)
	repeated(w, 2, r.ScopeProfiles, (*wireWriter).scopeProfiles)
	optional(w, 1, r.Resource, (*wireWriter).resource)
}

func (w *wireWriter) resource(r *resourcepb.Resource) {
	repeated(w, 3, r.EntityRefs, (*wireWriter).entityRef)
	w.uint64Field(2, uint64(r.DroppedAttributesCount))
	repeated(w, 1, r.Attributes, (*wireWriter).keyValue)
}

func (w *wireWriter) entityRef(e *commonpb.EntityRef) {
	w.strings(4, e.DescriptionKeys)
	w.strings(3, e.IdKeys)
	w.stringField(2, e.Type)
	w.stringField(1, e.SchemaUrl)
}

func (w *wireWriter) keyValue(kv *commonpb.KeyValue) {
	w.int32Field(3, kv.KeyStrindex)
	optional(w, 2, kv.Value, (*wireWriter).anyValue)
	w.stringField(1, kv.Key)
}

// anyValue writes the one value set; a oneof's field is written even when zero.
func (w *wireWriter) anyValue(v *commonpb.AnyValue) {
	switch x := v.Value.(type) {
	case *commonpb.AnyValue_StringValue:
		w.str(x.StringValue)
		w.varint(uint64(len(x.StringValue)))
		w.tag(1, protowire.BytesType)
	case *commonpb.AnyValue_BoolValue:
		b := uint64(0)
		if x.BoolValue {
			b = 1
		}
		w.varint(b)
		w.tag(2, protowire.VarintType)
	case *commonpb.AnyValue_IntValue:
		w.varint(uint64(x.IntValue))
		w.tag(3, protowire.VarintType)
	case *commonpb.AnyValue_DoubleValue:
		w.fixed64(math.Float64bits(x.DoubleValue))
		w.tag(4, protowire.Fixed64Type)
	case *commonpb.AnyValue_ArrayValue:
		message(w, 5, x.ArrayValue, (*wireWriter).arrayValue)
	case *commonpb.AnyValue_KvlistValue:
		message(w, 6, x.KvlistValue, (*wireWriter).keyValueList)
	case *commonpb.AnyValue_BytesValue:
		w.raw(x.BytesValue)
		w.varint(uint64(len(x.BytesValue)))
		w.tag(7, protowire.BytesType)
	case *commonpb.AnyValue_StringValueStrindex:
		w.varint(uint64(int64(x.StringValueStrindex)))
		w.tag(8, protowire.VarintType)
	}
}

func (w *wireWriter) arrayValue(a *commonpb.ArrayValue) {
	repeated(w, 1, a.Values, (*wireWriter).anyValue)
}

func (w *wireWriter) keyValueList(l *commonpb.KeyValueList) {
	repeated(w, 1, l.Values, (*wireWriter).keyValue)
}

func (w *wireWriter) scopeProfiles(s *profilespb.ScopeProfiles) {
	w.stringField(3, s.SchemaUrl)
	repeated(w, 2, s.Profiles, (*wireWriter).profile)
	optional(w, 1, s.Scope, (*wireWriter).scope)
}

func (w *wireWriter) scope(s *commonpb.InstrumentationScope) {
	w.uint64Field(4, uint64(s.DroppedAttributesCount))
	repeated(w, 3, s.Attributes, (*wireWriter).keyValue)
	w.stringField(2, s.Version)
	w.stringField(1, s.Name)
}

func (w *wireWriter) profile(p *profilespb.Profile) {
	w.packedInt32(11, p.AttributeIndices)
	w.bytesField(10, p.OriginalPayload)
	w.stringField(9, p.OriginalPayloadFormat)
	w.uint64Field(8, uint64(p.DroppedAttributesCount))
	w.bytesField(7, p.ProfileId)
	w.int64Field(6, p.Period)
	optional(w, 5, p.PeriodType, (*wireWriter).valueType)
	w.uint64Field(4, p.DurationNano)
	w.fixed64Field(3, p.TimeUnixNano)
	repeated(w, 2, p.Samples, (*wireWriter).sample)
	optional(w, 1, p.SampleType, (*wireWriter).valueType)
}

func (w *wireWriter) valueType(v *profilespb.ValueType) {
	w.int32Field(2, v.UnitStrindex)
	w.int32Field(1, v.TypeStrindex)
}

func (w *wireWriter) sample(s *profilespb.Sample) {
	w.packedFixed64(5, s.TimestampsUnixNano)
	w.packedInt64(4, s.Values)
	w.int32Field(3, s.LinkIndex)
	w.packedInt32(2, s.AttributeIndices)
	w.int32Field(1, s.StackIndex)
}

func (w *wireWriter) dictionary(d *profilespb.ProfilesDictionary) {
	repeated(w, 7, d.StackTable, (*wireWriter).stack)
	repeated(w, 6, d.AttributeTable, (*wireWriter).keyValueAndUnit)
	w.strings(5, d.StringTable)
	repeated(w, 4, d.LinkTable, (*wireWriter).link)
	repeated(w, 3, d.FunctionTable, (*wireWriter).function)
	repeated(w, 2, d.LocationTable, (*wireWriter).location)
	repeated(w, 1, d.MappingTable, (*wireWriter).mapping)
}

func (w *wireWriter) mapping(m *profilespb.Mapping) {
	w.packedInt32(5, m.AttributeIndices)
	w.int32Field(4, m.FilenameStrindex)
	w.uint64Field(3, m.FileOffset)
	w.uint64Field(2, m.MemoryLimit)
	w.uint64Field(1, m.MemoryStart)
}

func (w *wireWriter) location(l *profilespb.Location) {
	w.packedInt32(4, l.AttributeIndices)
	repeated(w, 3, l.Lines, (*wireWriter).line)
	w.uint64Field(2, l.Address)
	w.int32Field(1, l.MappingIndex)
}

func (w *wireWriter) line(l *profilespb.Line) {
	w.int64Field(3, l.Column)
	w.int64Field(2, l.Line)
	w.int32Field(1, l.FunctionIndex)
}

func (w *wireWriter) function(f *profilespb.Function) {
	w.int64Field(4, f.StartLine)
	w.int32Field(3, f.FilenameStrindex)
	w.int32Field(2, f.SystemNameStrindex)
	w.int32Field(1, f.NameStrindex)
}

func (w *wireWriter) link(l *profilespb.Link) {
	w.bytesField(2, l.SpanId)
	w.bytesField(1, l.TraceId)
}

func (w *wireWriter) stack(s *profilespb.Stack) {
	w.packedInt32(1, s.LocationIndices)
}

func (w *wireWriter) keyValueAndUnit(kv *profilespb.KeyValueAndUnit) {
	w.int32Field(3, kv.UnitStrindex)
	optional(w, 2, kv.Value, (*wireWriter).anyValue)
	w.int32Field(1, kv.KeyStrindex)
}

// errResponse is a collector's response that is not an ExportProfilesServiceResponse.
var errResponse = errors.New("malformed export response")

// unmarshalResponse reads a collector's ExportProfilesServiceResponse: its partial
// success (rejected_profiles = 1, error_message = 2), if any. Unknown fields are
// skipped, as a newer collector may send some.
func unmarshalResponse(b []byte, resp *collectorpb.ExportProfilesServiceResponse) error {
	resp.PartialSuccess = nil // the one field; Reset would go through protobuf's reflection
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		ps := resp.PartialSuccess
		if ps == nil {
			ps = new(collectorpb.ExportProfilesPartialSuccess)
			resp.PartialSuccess = ps
		}
		// A message field seen twice is merged, as protobuf does.
		return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
			switch {
			case num == 1 && typ == protowire.VarintType:
				ps.RejectedProfiles = int64(n)
			case num == 2 && typ == protowire.BytesType:
				ps.ErrorMessage = string(v)
			}
			return nil
		})
	})
}

// eachField calls f with each field of a message: its number and type, and its value as
// bytes (length-delimited) or as a number (varint). Other fields are skipped.
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %w", errResponse, protowire.ParseError(n))
		}
		b = b[n:]
		var (
			v []byte
			x uint64
		)
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("%w: field %d: %w", errResponse, num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}
