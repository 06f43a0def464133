package otlp

import (
	"slices"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/trace"
)

func linkOf(b byte) trace.Link {
	var l trace.Link
	l.TraceID[0], l.TraceID[15], l.SpanID[7] = b, b, b
	return l
}

// Samples that differ only in their span stay apart, each with its link_table entry; the
// table holds each span once after the zero link, and a context's attributes join the
// thread's among the sample's attributes.
func TestEncodeLinks(t *testing.T) {
	f := newFixture()
	base := *f.profile.Samples[1]
	a1, a2, b := base, base, base
	a1.Link, a1.Count = linkOf(1), 2
	a2.Link, a2.Count = linkOf(1), 3
	b.Link, b.Count = linkOf(2), 5
	b.Attributes = []trace.Attribute{{Key: "http.route", Value: "/cart"}}
	p := &trace.Profile{Start: t0, End: t0.Add(time.Second), Period: f.profile.Period, Locations: f.profile.Locations,
		Samples: []*trace.Sample{&base, &a1, &a2, &b}}
	req := Encode([]*trace.Profile{p}, testHost, EncodeOptions{})
	checkDictionary(t, req)
	d := req.Dictionary
	if len(d.LinkTable) != 3 || !isZeroBytes(d.LinkTable[0].TraceId) || len(d.LinkTable[0].SpanId) != 8 {
		t.Fatalf("link table %v: want the zero link and two spans", d.LinkTable)
	}
	samples := req.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].Samples
	if len(samples) != 3 {
		t.Fatalf("%d samples, want 3: none, span 1 (merged), span 2", len(samples))
	}
	counts := map[byte]int64{}
	for _, s := range samples {
		l := d.LinkTable[s.LinkIndex]
		counts[l.TraceId[0]] += s.Values[0]
		got := attrs(d, s.AttributeIndices)
		if l.TraceId[0] == 2 && !slices.Contains(got, "http.route=/cart") {
			t.Errorf("span 2's sample attributes %v lack the context's", got)
		}
		if !slices.Contains(got, "thread.name=worker") {
			t.Errorf("sample attributes %v lost the thread's", got)
		}
		if l.TraceId[0] != 0 && (l.TraceId[15] != l.TraceId[0] || l.SpanId[7] != l.TraceId[0]) {
			t.Errorf("link %x/%x", l.TraceId, l.SpanId)
		}
	}
	if counts[0] != 2 || counts[1] != 5 || counts[2] != 5 {
		t.Errorf("counts by span %v", counts)
	}
}

// A process's published resource names it before its environment does; a Describer's
// attributes still win, and the published ones reach the resource.
func TestEncodePublishedResource(t *testing.T) {
	pub := map[string]string{"service.name": "checkout", "service.version": "1.4.2"}
	for _, tc := range []struct {
		proc trace.Process
		want string
	}{
		{trace.Process{PID: 1, Name: "app", EnvServiceName: "env-name", Published: pub}, "checkout"},
		{trace.Process{PID: 1, Name: "app", Published: pub, Attributes: map[string]string{"service.name": "described"}}, "described"},
	} {
		p := &trace.Profile{Start: t0, End: t0.Add(time.Second), Samples: []*trace.Sample{{Process: &tc.proc, TID: 1, Count: 1}}}
		req := Encode([]*trace.Profile{p}, Resource{}, EncodeOptions{})
		rp := req.ResourceProfiles[0]
		if got, _ := resourceAttr(rp, "service.name"); got != tc.want {
			t.Errorf("service.name %v, want %s", got, tc.want)
		}
		if got, _ := resourceAttr(rp, "service.version"); got != "1.4.2" {
			t.Errorf("service.version %v", got)
		}
	}
	// Two descriptions of one process that differ in what it published are two resources.
	a := &trace.Process{PID: 1, Name: "app", Published: map[string]string{"service.version": "1"}}
	b := &trace.Process{PID: 1, Name: "app", Published: map[string]string{"service.version": "2"}}
	p := &trace.Profile{Start: t0, End: t0.Add(time.Second), Samples: []*trace.Sample{{Process: a, TID: 1, Count: 1}, {Process: b, TID: 1, Count: 1}}}
	if req := Encode([]*trace.Profile{p}, Resource{}, EncodeOptions{}); len(req.ResourceProfiles) != 2 {
		t.Errorf("%d resources", len(req.ResourceProfiles))
	}
}
