package tracectx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func str(s string) *commonpb.AnyValue {
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: s}}
}

// payload encodes a ProcessContext as a publisher does: the resource as field 1, further
// attributes as field 2.
func payload(t testing.TB, resource map[string]*commonpb.AnyValue, extra ...*commonpb.KeyValue) []byte {
	r := &resourcepb.Resource{}
	for k, v := range resource {
		r.Attributes = append(r.Attributes, &commonpb.KeyValue{Key: k, Value: v})
	}
	rb, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	b := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), rb)
	for _, kv := range extra {
		kb, err := proto.Marshal(kv)
		if err != nil {
			t.Fatal(err)
		}
		b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), kb)
	}
	return b
}

func keyMap(names ...string) *commonpb.KeyValue {
	arr := &commonpb.ArrayValue{}
	for _, n := range names {
		arr.Values = append(arr.Values, str(n))
	}
	return &commonpb.KeyValue{Key: KeyAttributeMap, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: arr}}}
}

func TestParsePayload(t *testing.T) {
	b := payload(t, map[string]*commonpb.AnyValue{
		"service.name":    str("checkout"),
		"service.version": str("1.4.2"),
		"process.pid":     {Value: &commonpb.AnyValue_IntValue{IntValue: 42}},
		"tags":            {Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: []*commonpb.AnyValue{str("a"), str("b")}}}},
	}, &commonpb.KeyValue{Key: KeySchemaVersion, Value: str(SchemaTLS)}, keyMap("http.route", "user"))
	pc, err := ParsePayload(b)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"service.name": "checkout", "service.version": "1.4.2", "process.pid": "42", "tags": `["a","b"]`} {
		if pc.Resource[k] != want {
			t.Errorf("%s = %q, want %q", k, pc.Resource[k], want)
		}
	}
	// The thread context's keys are coordination, not resource attributes.
	if _, ok := pc.Resource[KeySchemaVersion]; ok || !pc.ThreadContext() || len(pc.KeyMap) != 2 || pc.KeyMap[1] != "user" {
		t.Errorf("schema %q key map %v resource %v", pc.Schema, pc.KeyMap, pc.Resource)
	}
	dev, _ := ParsePayload(payload(t, nil, &commonpb.KeyValue{Key: KeySchemaVersion, Value: str(SchemaTLSDev)}))
	golabels, _ := ParsePayload(payload(t, nil, &commonpb.KeyValue{Key: KeySchemaVersion, Value: str(SchemaGoLabels)}))
	if !dev.ThreadContext() || golabels.ThreadContext() {
		t.Errorf("tlsdesc_v1_dev announces the TLS thread context, go_pprof_labels_v1 does not")
	}
	if _, err := ParsePayload([]byte{0x0a, 0x05, 1}); err == nil {
		t.Error("a payload cut short parsed")
	}
}

func TestParsePayloadBounds(t *testing.T) {
	res := map[string]*commonpb.AnyValue{}
	for i := range MaxResourceAttributes + 10 {
		res[fmt.Sprint("k", i)] = str("v")
	}
	var names []string
	for i := range MaxKeyMap + 5 {
		names = append(names, fmt.Sprint("key", i))
	}
	pc, err := ParsePayload(payload(t, res, keyMap(names...)))
	if err != nil {
		t.Fatal(err)
	}
	if len(pc.Resource) != MaxResourceAttributes || len(pc.KeyMap) != MaxKeyMap {
		t.Errorf("%d attributes, %d keys", len(pc.Resource), len(pc.KeyMap))
	}
}

// memory is a process's memory for ReadProcessContext: a header and a payload, and a
// hook that runs between reads, as a concurrent writer would.
type memory struct {
	regions map[uint64][]byte
	reads   int
	between func(m *memory)
}

func (m *memory) ReadAt(p []byte, addr uint64) (int, error) {
	m.reads++
	if m.between != nil {
		defer m.between(m)
	}
	for base, b := range m.regions {
		if addr >= base && addr+uint64(len(p)) <= base+uint64(len(b)) {
			return copy(p, b[addr-base:]), nil
		}
	}
	return 0, errors.New("EFAULT")
}

const headerAt, payloadAt = 0x1000, 0x9000

func header(size uint32, at uint64) []byte {
	h := make([]byte, HeaderSize)
	copy(h, "OTEL_CTX")
	binary.NativeEndian.PutUint32(h[8:], HeaderVersion)
	binary.NativeEndian.PutUint32(h[12:], size)
	binary.NativeEndian.PutUint64(h[16:], at)
	binary.NativeEndian.PutUint64(h[24:], payloadAt)
	return h
}

func TestReadProcessContext(t *testing.T) {
	p := payload(t, map[string]*commonpb.AnyValue{"service.name": str("svc")})
	m := &memory{regions: map[uint64][]byte{headerAt: header(uint32(len(p)), 77), payloadAt: p}}
	pc, at, err := ReadProcessContext(m, headerAt, 0)
	if err != nil || at != 77 || pc.Resource["service.name"] != "svc" {
		t.Fatalf("%+v %d %v", pc, at, err)
	}
	// Unchanged since: only the header is read.
	m.reads = 0
	if pc, at, err := ReadProcessContext(m, headerAt, 77); pc != nil || at != 77 || err != nil || m.reads != 1 {
		t.Errorf("unchanged: %v %d %v after %d reads", pc, at, err, m.reads)
	}
}

// A writer updating the context between the reader's first and second look at the header
// tears the copy: the reader starts over, and gives up if it never settles.
func TestReadProcessContextTorn(t *testing.T) {
	p := payload(t, map[string]*commonpb.AnyValue{"service.name": str("svc")})
	m := &memory{regions: map[uint64][]byte{headerAt: header(uint32(len(p)), 1), payloadAt: p}}
	stamp := uint64(1)
	m.between = func(m *memory) {
		if m.reads%3 == 2 { // after the payload's read: publish again
			stamp++
			binary.NativeEndian.PutUint64(m.regions[headerAt][16:], stamp)
		}
	}
	if _, _, err := ReadProcessContext(m, headerAt, 0); !errors.Is(err, ErrTorn) {
		t.Errorf("a context that never settles: %v", err)
	}
	// One update during the read, then quiet: the second attempt reads it whole.
	m.reads, stamp = 0, 10
	binary.NativeEndian.PutUint64(m.regions[headerAt][16:], stamp)
	m.between = func(m *memory) {
		if m.reads == 2 {
			binary.NativeEndian.PutUint64(m.regions[headerAt][16:], 11)
		}
	}
	pc, at, err := ReadProcessContext(m, headerAt, 0)
	if err != nil || at != 11 || pc.Resource["service.name"] != "svc" {
		t.Errorf("after one update: %v %d %v", pc, at, err)
	}
	// An update in progress (timestamp 0) throughout.
	binary.NativeEndian.PutUint64(m.regions[headerAt][16:], 0)
	m.between = nil
	if _, _, err := ReadProcessContext(m, headerAt, 0); !errors.Is(err, ErrTorn) || !errors.Is(err, ErrUpdating) {
		t.Errorf("always updating: %v", err)
	}
}

func TestParseHeaderRefuses(t *testing.T) {
	bad := func(f func(h []byte)) []byte { h := header(10, 5); f(h); return h }
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"short":     {header(10, 5)[:20], ErrInvalid},
		"signature": {bad(func(h []byte) { h[0] = 'X' }), ErrInvalid},
		"version":   {bad(func(h []byte) { binary.NativeEndian.PutUint32(h[8:], 1) }), ErrInvalid},
		"updating":  {header(10, 0), ErrUpdating},
		"oversized": {header(MaxPayload+1, 5), ErrOversized},
	} {
		if _, err := ParseHeader(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}

func TestIsContextMapping(t *testing.T) {
	for path, want := range map[string]bool{
		"[anon_shmem:OTEL_CTX]": true, "[anon:OTEL_CTX]": true, "/memfd:OTEL_CTX (deleted)": true,
		"[anon:other]": false, "/usr/lib/OTEL_CTX": false, "": false,
	} {
		if IsContextMapping(path) != want {
			t.Errorf("%q: want %v", path, want)
		}
	}
}

func FuzzParsePayload(f *testing.F) {
	f.Add(payload(f, map[string]*commonpb.AnyValue{"service.name": str("svc")}, &commonpb.KeyValue{Key: KeySchemaVersion, Value: str(SchemaTLS)}, keyMap("a", "b")))
	f.Add([]byte{0x12, 0x03, 0x0a, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		pc, err := ParsePayload(b)
		if err != nil {
			return
		}
		if len(pc.Resource) > MaxResourceAttributes || len(pc.KeyMap) > MaxKeyMap {
			t.Fatalf("%d attributes, %d keys", len(pc.Resource), len(pc.KeyMap))
		}
		for k, v := range pc.Resource {
			if len(k) > MaxAttributeKey || len(v) > MaxAttributeValue {
				t.Fatalf("attribute of %d and %d bytes", len(k), len(v))
			}
		}
	})
}

func FuzzReadProcessContext(f *testing.F) {
	f.Add(header(4, 9), []byte{0x0a, 0x02, 0x0a, 0x00}, uint8(0))
	f.Fuzz(func(t *testing.T, h, p []byte, flip uint8) {
		m := &memory{regions: map[uint64][]byte{headerAt: h, payloadAt: p}}
		m.between = func(m *memory) {
			if flip != 0 && m.reads%int(flip) == 0 && len(h) >= 24 {
				h[16]++
			}
		}
		pc, at, err := ReadProcessContext(m, headerAt, 0)
		if err == nil && pc != nil && at == 0 {
			t.Fatal("a context read with timestamp 0")
		}
		if m.reads > 3*readAttempts {
			t.Fatalf("%d reads", m.reads)
		}
	})
}
