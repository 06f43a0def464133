package tracectx

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The process context (OTEP 4719): a header in a mapping /proc/PID/maps names OTEL_CTX,
// pointing at a protobuf ProcessContext.
const (
	// HeaderSize is the header's size: signature, version, payload_size,
	// monotonic_published_at_ns and the payload pointer.
	HeaderSize = 32
	// HeaderVersion is the only header version the merged OTEP defines.
	HeaderVersion = 2
	// MaxPayload bounds the payload read: the OTEP expects kilobytes.
	MaxPayload = 256 << 10
	// MaxResourceAttributes, MaxAttributeKey and MaxAttributeValue bound what of a
	// resource is kept; what lies beyond is dropped.
	MaxResourceAttributes = 128
	MaxAttributeKey       = 256
	MaxAttributeValue     = 4096
	// MaxKeyMap is what a uint8 key index can name.
	MaxKeyMap = 256
)

// Values of threadlocal.schema_version a reader acts on.
const (
	// SchemaTLS and SchemaTLSDev announce the TLS thread context; the merged OTEP names
	// the first, and its text still the development name.
	SchemaTLS    = "tls_v1"
	SchemaTLSDev = "tlsdesc_v1_dev"
	// SchemaGoLabels: a Go program whose context is in its goroutines' pprof labels.
	SchemaGoLabels = "go_pprof_labels_v1"
)

// Process context attribute keys of the thread context (OTEP 4947).
const (
	KeySchemaVersion = "threadlocal.schema_version"
	KeyAttributeMap  = "threadlocal.attribute_key_map"
)

var signature = [8]byte{'O', 'T', 'E', 'L', '_', 'C', 'T', 'X'}

// ErrUpdating: the header's timestamp is 0, which says the publisher is updating it.
var ErrUpdating = errors.New("process context being updated")

// Header is a process context header.
type Header struct {
	PayloadSize uint32
	// PublishedAt changes with every update: it keys what was read.
	PublishedAt uint64
	Payload     uint64 // the payload's address in the process
}

// ParseHeader checks and parses a process context header.
func ParseHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < HeaderSize {
		return h, fmt.Errorf("header of %d bytes: %w", len(b), ErrInvalid)
	}
	if !bytes.Equal(b[:8], signature[:]) {
		return h, fmt.Errorf("signature %q: %w", b[:8], ErrInvalid)
	}
	if v := binary.NativeEndian.Uint32(b[8:]); v != HeaderVersion {
		return h, fmt.Errorf("header version %d: %w", v, ErrInvalid)
	}
	h.PayloadSize = binary.NativeEndian.Uint32(b[12:])
	h.PublishedAt = binary.NativeEndian.Uint64(b[16:])
	h.Payload = binary.NativeEndian.Uint64(b[24:])
	if h.PublishedAt == 0 {
		return h, ErrUpdating
	}
	if h.PayloadSize > MaxPayload {
		return h, fmt.Errorf("payload of %d bytes: %w", h.PayloadSize, ErrOversized)
	}
	return h, nil
}

// Memory reads another process's memory.
type Memory interface {
	ReadAt(p []byte, addr uint64) (int, error)
}

// readFull reads len(p) bytes at addr.
func readFull(m Memory, p []byte, addr uint64) error {
	n, err := m.ReadAt(p, addr)
	if err == nil && n < len(p) {
		err = fmt.Errorf("read %d of %d bytes at %#x", n, len(p), addr)
	}
	return err
}

// readAttempts bounds the re-reads of a context the publisher keeps changing.
const readAttempts = 3

// ReadProcessContext reads the process context whose header is at addr, following the
// OTEP's reading protocol: the header is read and checked, the payload copied, and the
// header read again; a timestamp that changed (or was 0) means the copy may be torn, and
// it starts over. If the timestamp is still have, the process context did not change and
// nil is returned with it.
func ReadProcessContext(m Memory, addr uint64, have uint64) (*ProcessContext, uint64, error) {
	var hb, again [HeaderSize]byte
	var err error
	for range readAttempts {
		if err = readFull(m, hb[:], addr); err != nil {
			return nil, 0, fmt.Errorf("read process context header: %w", err)
		}
		var h Header
		h, err = ParseHeader(hb[:])
		if errors.Is(err, ErrUpdating) {
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		if h.PublishedAt == have {
			return nil, have, nil
		}
		payload := make([]byte, h.PayloadSize)
		if err = readFull(m, payload, h.Payload); err != nil {
			return nil, 0, fmt.Errorf("read process context payload: %w", err)
		}
		if err = readFull(m, again[:], addr); err != nil {
			return nil, 0, fmt.Errorf("read process context header again: %w", err)
		}
		if binary.NativeEndian.Uint64(again[16:]) != h.PublishedAt {
			err = fmt.Errorf("published at %d, then %d: %w", h.PublishedAt, binary.NativeEndian.Uint64(again[16:]), ErrTorn)
			continue
		}
		pc, err := ParsePayload(payload)
		if err != nil {
			return nil, 0, err
		}
		return pc, h.PublishedAt, nil
	}
	if errors.Is(err, ErrUpdating) {
		err = fmt.Errorf("%w: %w", ErrTorn, err)
	}
	return nil, 0, err
}

// ProcessContext is what a process published about itself.
type ProcessContext struct {
	// Resource holds the resource's attributes, values as strings (arrays and maps as
	// their JSON-like text), within the bounds above.
	Resource map[string]string
	// Schema is threadlocal.schema_version; empty when not published.
	Schema string
	// KeyMap is threadlocal.attribute_key_map: the name of each key index.
	KeyMap []string
}

// ThreadContext reports whether the context announces the TLS thread context.
func (pc *ProcessContext) ThreadContext() bool {
	return pc != nil && (pc.Schema == SchemaTLS || pc.Schema == SchemaTLSDev)
}

// ParsePayload decodes a ProcessContext message: field 1 the Resource, field 2 further
// attributes (the threadlocal.* keys among them). Decoded field by field over the common
// and resource messages it is made of, which also keeps unknown fields harmless.
func ParsePayload(b []byte) (*ProcessContext, error) {
	if len(b) > MaxPayload {
		return nil, fmt.Errorf("payload of %d bytes: %w", len(b), ErrOversized)
	}
	pc := &ProcessContext{Resource: map[string]string{}}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("process context payload: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.BytesType || (num != 1 && num != 2) {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return nil, fmt.Errorf("process context payload: %w", protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, fmt.Errorf("process context payload: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if num == 1 {
			var r resourcepb.Resource
			if err := proto.Unmarshal(v, &r); err != nil {
				return nil, fmt.Errorf("process context resource: %w", err)
			}
			for _, kv := range r.Attributes {
				if len(pc.Resource) >= MaxResourceAttributes {
					break
				}
				if k := kv.GetKey(); k != "" && len(k) <= MaxAttributeKey {
					pc.Resource[validUTF8(k)] = clip(validUTF8(valueString(kv.GetValue())), MaxAttributeValue)
				}
			}
			continue
		}
		var kv commonpb.KeyValue
		if err := proto.Unmarshal(v, &kv); err != nil {
			return nil, fmt.Errorf("process context attribute: %w", err)
		}
		switch kv.GetKey() {
		case KeySchemaVersion:
			pc.Schema = validUTF8(kv.GetValue().GetStringValue())
		case KeyAttributeMap:
			pc.KeyMap = pc.KeyMap[:0]
			for i, e := range kv.GetValue().GetArrayValue().GetValues() {
				if i >= MaxKeyMap {
					break
				}
				pc.KeyMap = append(pc.KeyMap, clip(validUTF8(e.GetStringValue()), MaxAttributeKey))
			}
		}
	}
	return pc, nil
}

func clip(s string, n int) string {
	if len(s) > n {
		return strings.ToValidUTF8(s[:n], "")
	}
	return s
}

// valueString renders an attribute value as a string.
func valueString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		if math.IsInf(x.DoubleValue, 0) || math.IsNaN(x.DoubleValue) {
			return fmt.Sprint(x.DoubleValue)
		}
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	case *commonpb.AnyValue_BytesValue:
		return fmt.Sprintf("%x", x.BytesValue)
	case *commonpb.AnyValue_ArrayValue:
		parts := make([]string, 0, len(x.ArrayValue.GetValues()))
		for _, e := range x.ArrayValue.GetValues() {
			parts = append(parts, strconv.Quote(valueString(e)))
		}
		return "[" + strings.Join(parts, ",") + "]"
	case *commonpb.AnyValue_KvlistValue:
		parts := make([]string, 0, len(x.KvlistValue.GetValues()))
		for _, kv := range x.KvlistValue.GetValues() {
			parts = append(parts, strconv.Quote(kv.GetKey())+":"+strconv.Quote(valueString(kv.GetValue())))
		}
		return "{" + strings.Join(parts, ",") + "}"
	default:
		return ""
	}
}

// IsContextMapping reports whether a /proc/PID/maps path names a process context mapping:
// memfd_create and prctl both worked, only prctl, or only memfd_create.
func IsContextMapping(path string) bool {
	for _, p := range [...]string{"[anon_shmem:OTEL_CTX]", "[anon:OTEL_CTX]", "/memfd:OTEL_CTX"} {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}
