package tracectx

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Link names the span a sample was taken in. The zero Link names none.
type Link struct {
	TraceID [16]byte
	SpanID  [8]byte
}

// IsZero reports whether l names no span.
func (l Link) IsZero() bool { return l == Link{} }

// Attribute is a string attribute a thread or goroutine published with its span.
type Attribute struct {
	Key, Value string
}

// Bounds of what the kernel copies (bpf.MaxContextBytes and friends).
const (
	// RecordHeaderSize is the fixed part of a thread context record: trace-id, span-id,
	// valid, trace-flags and attrs-data-size.
	RecordHeaderSize = 28
	// MaxRecordSize bounds a whole record: OTEP 4947 recommends 640 bytes at most, which
	// the kernel copies; a longer record is ignored.
	MaxRecordSize = 640
)

// Errors of the parsers: the caller counts them by kind.
var (
	// ErrInvalid: a record whose valid byte is not 1, or that is too short to be one.
	ErrInvalid = errors.New("invalid thread context record")
	// ErrOversized: a record or payload over the bound this package reads.
	ErrOversized = errors.New("context over the size bound")
	// ErrTorn: data that changed while it was read, or ends before it says it does.
	ErrTorn = errors.New("context changed while read")
)

// Record is a parsed OpenTelemetry thread context record.
type Record struct {
	Link  Link
	Flags byte // W3C trace-flags
	// Attributes resolved through the process's key map, in key-index order; a key
	// index repeated counts with its last value, as the OTEP asks.
	Attributes []Attribute
	// UnknownKeys counts entries whose key index the key map lacks: the reader must
	// read the key map again, which may have grown.
	UnknownKeys int
	// Cut says attrs-data ended inside an entry; the entries before it were kept.
	Cut bool
}

// ParseRecord parses a thread context record as the kernel copied it: the header, then
// attrs-data-size bytes of entries (key index, value length, value). keys is the
// process's threadlocal.attribute_key_map.
func ParseRecord(b []byte, keys []string) (Record, error) {
	var r Record
	if len(b) < RecordHeaderSize {
		return r, fmt.Errorf("%d bytes, want at least %d: %w", len(b), RecordHeaderSize, ErrInvalid)
	}
	if b[24] != 1 {
		return r, fmt.Errorf("valid byte %d: %w", b[24], ErrInvalid)
	}
	size := int(binary.NativeEndian.Uint16(b[26:28]))
	if RecordHeaderSize+size > MaxRecordSize {
		return r, fmt.Errorf("%d bytes of attributes: %w", size, ErrOversized)
	}
	if len(b) < RecordHeaderSize+size {
		return r, fmt.Errorf("%d bytes of attributes announced, %d copied: %w", size, len(b)-RecordHeaderSize, ErrTorn)
	}
	copy(r.Link.TraceID[:], b[:16])
	copy(r.Link.SpanID[:], b[16:24])
	r.Flags = b[25]
	// A trace-id without a span-id, or the reverse, is half a link: the OTEP sets both or neither.
	if (r.Link.TraceID == [16]byte{}) != (r.Link.SpanID == [8]byte{}) {
		return r, fmt.Errorf("trace-id and span-id not both set: %w", ErrInvalid)
	}
	var byKey [256]*string
	data := b[RecordHeaderSize : RecordHeaderSize+size]
	for len(data) > 0 {
		if len(data) < 2 || len(data) < 2+int(data[1]) {
			r.Cut = true
			break
		}
		k, v := int(data[0]), data[2:2+int(data[1])]
		data = data[2+len(v):]
		if k >= len(keys) {
			r.UnknownKeys++
			continue
		}
		s := validUTF8(string(v))
		byKey[k] = &s
	}
	for k, v := range byKey {
		if v != nil {
			r.Attributes = append(r.Attributes, Attribute{Key: keys[k], Value: *v})
		}
	}
	return r, nil
}

// Go label keys that carry the span: the wrapper in otelprofiling sets them, as
// OpenTelemetry's own Go profiling integrations do.
const (
	LabelTraceID = "trace_id"
	LabelSpanID  = "span_id"
)

// ParseGoLabels parses a goroutine's labels as the kernel copied them: per label a key
// length byte, a value length byte, the key and the value.
func ParseGoLabels(b []byte) ([]Attribute, error) {
	var out []Attribute
	for len(b) > 0 {
		if len(b) < 2 || len(b) < 2+int(b[0])+int(b[1]) {
			return out, fmt.Errorf("label cut after %d: %w", len(out), ErrTorn)
		}
		k, v := int(b[0]), int(b[1])
		out = append(out, Attribute{Key: validUTF8(string(b[2 : 2+k])), Value: validUTF8(string(b[2+k : 2+k+v]))})
		b = b[2+k+v:]
	}
	return out, nil
}

// GoLink takes the span out of Go labels: trace_id (32 hex digits) and span_id (16), both
// present and neither all zero. It returns the link and the other labels; labels that do
// not make a link stay labels.
func GoLink(labels []Attribute) (Link, []Attribute) {
	var l Link
	var tid, sid string
	for _, a := range labels {
		switch a.Key {
		case LabelTraceID:
			tid = a.Value
		case LabelSpanID:
			sid = a.Value
		}
	}
	if len(tid) != 32 || len(sid) != 16 {
		return Link{}, labels
	}
	if _, err := hex.Decode(l.TraceID[:], []byte(tid)); err != nil {
		return Link{}, labels
	}
	if _, err := hex.Decode(l.SpanID[:], []byte(sid)); err != nil {
		return Link{}, labels
	}
	if l.TraceID == [16]byte{} || l.SpanID == [8]byte{} {
		return Link{}, labels
	}
	rest := make([]Attribute, 0, len(labels)-2)
	for _, a := range labels {
		if a.Key != LabelTraceID && a.Key != LabelSpanID {
			rest = append(rest, a)
		}
	}
	return l, rest
}

// validUTF8 keeps what a process wrote from breaking an export: protobuf refuses strings
// that are not UTF-8.
func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
