package tracectx

import (
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// record builds a thread context record as a writer lays it out.
func record(valid byte, attrs ...[]byte) []byte {
	b := make([]byte, RecordHeaderSize)
	for i := range 16 {
		b[i] = byte(i + 1)
	}
	for i := range 8 {
		b[16+i] = byte(0xa0 + i)
	}
	b[24], b[25] = valid, 1
	var data []byte
	for _, a := range attrs {
		data = append(data, a...)
	}
	binary.NativeEndian.PutUint16(b[26:], uint16(len(data)))
	return append(b, data...)
}

func attr(key byte, value string) []byte { return append([]byte{key, byte(len(value))}, value...) }

var keys = []string{"http.route", "user"}

func TestParseRecord(t *testing.T) {
	r, err := ParseRecord(record(1, attr(0, "/a"), attr(1, "bob"), attr(0, "/b")), keys)
	if err != nil {
		t.Fatal(err)
	}
	if r.Link.TraceID[0] != 1 || r.Link.TraceID[15] != 16 || r.Link.SpanID[0] != 0xa0 || r.Flags != 1 {
		t.Errorf("link %x/%x flags %d", r.Link.TraceID, r.Link.SpanID, r.Flags)
	}
	// A key repeated counts with its last value.
	want := []Attribute{{"http.route", "/b"}, {"user", "bob"}}
	if !reflect.DeepEqual(r.Attributes, want) || r.UnknownKeys != 0 || r.Cut {
		t.Errorf("attributes %v unknown %d cut %v, want %v", r.Attributes, r.UnknownKeys, r.Cut, want)
	}
}

func TestParseRecordRefuses(t *testing.T) {
	oversized := record(1, attr(0, strings.Repeat("x", 255)), attr(0, strings.Repeat("y", 255)), attr(0, strings.Repeat("z", 255)))
	torn := record(1, attr(0, "/abc"))
	halfLink := record(1)
	clear(halfLink[16:24])
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"short":             {record(1)[:20], ErrInvalid},
		"not valid":         {record(0), ErrInvalid},
		"reserved validity": {record(2), ErrInvalid},
		"oversized":         {oversized, ErrOversized},
		"torn":              {torn[:len(torn)-2], ErrTorn},
		"half a link":       {halfLink, ErrInvalid},
	} {
		if _, err := ParseRecord(tc.b, keys); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}

// Entries past the key map are skipped and counted, so the caller reads the map again;
// an entry cut short ends the parse, keeping what came before.
func TestParseRecordKeysAndCuts(t *testing.T) {
	r, err := ParseRecord(record(1, attr(1, "eve"), attr(7, "?"), []byte{0, 9, 'x'}), keys)
	if err != nil {
		t.Fatal(err)
	}
	if r.UnknownKeys != 1 || !r.Cut || !reflect.DeepEqual(r.Attributes, []Attribute{{"user", "eve"}}) {
		t.Errorf("%+v", r)
	}
	// Without a key map every entry is unknown.
	r, _ = ParseRecord(record(1, attr(0, "/a")), nil)
	if r.UnknownKeys != 1 || len(r.Attributes) != 0 {
		t.Errorf("no key map: %+v", r)
	}
	// No span: zero IDs, attributes still.
	b := record(1, attr(0, "/idle"))
	clear(b[:24])
	r, err = ParseRecord(b, keys)
	if err != nil || !r.Link.IsZero() || len(r.Attributes) != 1 {
		t.Errorf("no span: %+v, %v", r, err)
	}
}

func goLabels(kv ...string) []byte {
	var b []byte
	for i := 0; i+1 < len(kv); i += 2 {
		b = append(b, byte(len(kv[i])), byte(len(kv[i+1])))
		b = append(append(b, kv[i]...), kv[i+1]...)
	}
	return b
}

func TestGoLabels(t *testing.T) {
	labels, err := ParseGoLabels(goLabels("route", "/x", "span_id", "00f067aa0ba902b7", "trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"))
	if err != nil {
		t.Fatal(err)
	}
	link, rest := GoLink(labels)
	if link.TraceID[0] != 0x4b || link.SpanID[7] != 0xb7 || !reflect.DeepEqual(rest, []Attribute{{"route", "/x"}}) {
		t.Errorf("link %x/%x rest %v", link.TraceID, link.SpanID, rest)
	}
	// Labels that do not make a link stay labels.
	for _, kv := range [][]string{
		{"trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"trace_id", "not hex at all, but thirty-two!!", "span_id", "00f067aa0ba902b7"},
		{"trace_id", "00000000000000000000000000000000", "span_id", "00f067aa0ba902b7"},
		{"trace_id", "4bf92f3577b34da6", "span_id", "00f067aa0ba902b7"},
	} {
		labels, _ := ParseGoLabels(goLabels(kv...))
		if link, rest := GoLink(labels); !link.IsZero() || len(rest) != len(kv)/2 {
			t.Errorf("%v: link %v, rest %v", kv, link, rest)
		}
	}
	if _, err := ParseGoLabels(goLabels("k", "value")[:4]); !errors.Is(err, ErrTorn) {
		t.Errorf("cut label: %v", err)
	}
}

func FuzzParseRecord(f *testing.F) {
	f.Add(record(1, attr(0, "/a"), attr(1, "bob")), uint8(2))
	f.Add(record(0), uint8(0))
	f.Add(record(1, []byte{3, 200}), uint8(4))
	f.Fuzz(func(t *testing.T, b []byte, nkeys uint8) {
		km := make([]string, nkeys)
		for i := range km {
			km[i] = string(rune('a' + i%26))
		}
		r, err := ParseRecord(b, km)
		if err != nil {
			return
		}
		if len(r.Attributes) > len(km) || RecordHeaderSize+int(binary.NativeEndian.Uint16(b[26:])) > MaxRecordSize {
			t.Fatalf("%d attributes from a key map of %d, from %d bytes", len(r.Attributes), len(km), len(b))
		}
		for _, a := range r.Attributes {
			if !strings.Contains(strings.Join(km, "\x00"), a.Key) || len(a.Value) > 3*255 {
				t.Fatalf("attribute %q", a)
			}
		}
	})
}

func FuzzParseGoLabels(f *testing.F) {
	f.Add(goLabels("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736", "span_id", "00f067aa0ba902b7"))
	f.Add([]byte{1, 200, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		labels, _ := ParseGoLabels(b)
		if len(labels) > len(b)/2 {
			t.Fatalf("%d labels from %d bytes", len(labels), len(b))
		}
		link, rest := GoLink(labels)
		if !link.IsZero() && len(rest) != len(labels)-2 {
			t.Fatalf("link from %v left %v", labels, rest)
		}
	})
}
