package otelprofiling

import (
	"encoding/binary"
	"math"

	"go.opentelemetry.io/otel/attribute"
)

// Schema tells a reader to take this process's span from its goroutines' pprof labels.
const Schema = "go_pprof_labels_v1"

// encodeContext encodes an OpenTelemetry ProcessContext message (OTEP 4719): the resource
// (field 1, a Resource of KeyValues) and the thread context's schema among the further
// attributes (field 2). Written by hand: the message is four nested types, and a protobuf
// runtime would be the service's largest dependency on account of it.
func encodeContext(res []attribute.KeyValue) []byte {
	var resource []byte
	for _, kv := range res {
		resource = appendBytes(resource, 1, keyValue(string(kv.Key), kv.Value))
	}
	var out []byte
	out = appendBytes(out, 1, resource)
	out = appendBytes(out, 2, keyValue("threadlocal.schema_version", attribute.StringValue(Schema)))
	return out
}

func keyValue(k string, v attribute.Value) []byte {
	b := appendBytes(nil, 1, []byte(k))
	return appendBytes(b, 2, anyValue(v))
}

// anyValue encodes an AnyValue: string 1, bool 2, int 3, double 4, array 5.
func anyValue(v attribute.Value) []byte {
	var b []byte
	switch v.Type() {
	case attribute.BOOL:
		b = appendVarint(appendTag(b, 2, 0), boolInt(v.AsBool()))
	case attribute.INT64:
		b = appendVarint(appendTag(b, 3, 0), uint64(v.AsInt64()))
	case attribute.FLOAT64:
		b = binary.LittleEndian.AppendUint64(appendTag(b, 4, 1), math.Float64bits(v.AsFloat64()))
	case attribute.STRINGSLICE, attribute.BOOLSLICE, attribute.INT64SLICE, attribute.FLOAT64SLICE:
		var arr []byte
		for _, e := range sliceValues(v) {
			arr = appendBytes(arr, 1, anyValue(e))
		}
		b = appendBytes(b, 5, arr)
	default:
		b = appendBytes(b, 1, []byte(v.Emit()))
	}
	return b
}

func sliceValues(v attribute.Value) []attribute.Value {
	var out []attribute.Value
	switch v.Type() {
	case attribute.STRINGSLICE:
		for _, e := range v.AsStringSlice() {
			out = append(out, attribute.StringValue(e))
		}
	case attribute.BOOLSLICE:
		for _, e := range v.AsBoolSlice() {
			out = append(out, attribute.BoolValue(e))
		}
	case attribute.INT64SLICE:
		for _, e := range v.AsInt64Slice() {
			out = append(out, attribute.Int64Value(e))
		}
	case attribute.FLOAT64SLICE:
		for _, e := range v.AsFloat64Slice() {
			out = append(out, attribute.Float64Value(e))
		}
	}
	return out
}

func boolInt(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func appendTag(b []byte, field, wire uint64) []byte { return appendVarint(b, field<<3|wire) }

func appendBytes(b []byte, field uint64, v []byte) []byte {
	b = appendVarint(appendTag(b, field, 2), uint64(len(v)))
	return append(b, v...)
}

func appendVarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }
