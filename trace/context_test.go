package trace

import (
	"encoding/hex"
	"testing"
	"time"
)

func goLabels(kv ...string) []byte {
	var b []byte
	for i := 0; i+1 < len(kv); i += 2 {
		b = append(b, byte(len(kv[i])), byte(len(kv[i+1])))
		b = append(append(b, kv[i]...), kv[i+1]...)
	}
	return b
}

// A trace context joins the aggregation key: samples of one stack and thread in different
// spans are counted apart, each with its link and attributes; a context that does not parse
// counts as none, and is counted.
func TestAggregatorKeepsSpansApart(t *testing.T) {
	start := time.Now()
	a, _ := newAggregator(t, ProcessConfig{ProcFS: t.TempDir()}, Config{Period: time.Millisecond}, start)
	spanA := goLabels("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736", "span_id", "00f067aa0ba902b7", "route", "/a", "method", "GET")
	spanB := goLabels("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736", "span_id", "00f067aa0ba902b8", "route", "/b")
	stack := []uint64{0x401000, 0x402000}
	for _, ctx := range [][]byte{spanA, spanA, spanB, nil, {9, 9, 9}} {
		a.Add(RawSample{PID: 4242, TID: 4242, Comm: "svc", Time: start, User: stack, ContextKind: ContextGoLabels, Context: ctx})
	}
	st := a.Stats()
	p := a.Flush(start.Add(time.Second))
	bySpan := map[string]*Sample{}
	var unlinked int64
	for _, s := range p.Samples {
		if s.Link.IsZero() {
			// The sample without a context and the one whose context did not parse:
			// apart here, by their bytes, alike to the reporters.
			unlinked += s.Count
			if len(s.Attributes) != 0 {
				t.Errorf("attributes without a context: %v", s.Attributes)
			}
			continue
		}
		bySpan[hex.EncodeToString(s.Link.SpanID[:])] = s
	}
	sa, sb := bySpan["00f067aa0ba902b7"], bySpan["00f067aa0ba902b8"]
	if sa == nil || sb == nil || sa.Count != 2 || sb.Count != 1 || unlinked != 2 {
		t.Fatalf("samples by span: %v, %d without", bySpan, unlinked)
	}
	if len(sa.Attributes) != 2 || sa.Attributes[0] != (Attribute{Key: "method", Value: "GET"}) || sa.Attributes[1] != (Attribute{Key: "route", Value: "/a"}) {
		t.Errorf("span a's attributes %v: want method and route, sorted", sa.Attributes)
	}
	if st.Linked != 3 || st.ContextErrors != 1 {
		t.Errorf("linked %d, context errors %d; want 3 and 1", st.Linked, st.ContextErrors)
	}
}
