package pprof

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

// testProfile: two processes running the same binary, one kernel frame, one unnamed frame.
func testProfile(start time.Time) *trace.Profile {
	file := &objfile.File{Path: "/bin/app", GNUBuildID: "abcd"}
	kernel := &trace.Mapping{Start: 0xffff800000000000, End: ^uint64(0), Path: trace.KernelPath}
	m1 := &trace.Mapping{Start: 0x400000, End: 0x500000, Offset: 0x1000, Path: "/bin/app", File: file}
	m2 := &trace.Mapping{Start: 0x400000, End: 0x500000, Offset: 0x1000, Path: "/bin/app", File: file}
	leaf := &trace.Location{Kind: trace.FrameNative, Address: 0x400100, Mapping: m1,
		Lines: []trace.Line{{Function: "inlined", File: "a.c", Line: 3}, {Function: "leaf", File: "a.c", Line: 10}}}
	main1 := &trace.Location{Kind: trace.FrameNative, Address: 0x400200, Mapping: m1, Lines: []trace.Line{{Function: "main"}}}
	main2 := &trace.Location{Kind: trace.FrameNative, Address: 0x400200, Mapping: m2, Lines: []trace.Line{{Function: "main"}}}
	sys := &trace.Location{Kind: trace.FrameKernel, Address: 0xffffffff81000010, Mapping: kernel, Lines: []trace.Line{{Function: "do_syscall_64"}}}
	unnamed := &trace.Location{Kind: trace.FrameNative, Address: 0x400300, Mapping: m2}
	p1 := &trace.Process{PID: 1, Name: "app"}
	p2 := &trace.Process{PID: 2, Name: "app"}
	return &trace.Profile{
		Start: start, End: start.Add(10 * time.Second), Period: time.Second / 19,
		Locations: []*trace.Location{leaf, main1, main2, sys, unnamed},
		Samples: []*trace.Sample{
			{Process: p1, TID: 1, ThreadName: "app", Count: 5, Locations: []*trace.Location{leaf, main1}},
			{Process: p2, TID: 3, ThreadName: "worker", Count: 2, Locations: []*trace.Location{sys, unnamed, main2}},
		},
	}
}

func TestWriteRoundTrip(t *testing.T) {
	start := time.Unix(1700000000, 0)
	var buf bytes.Buffer
	if err := Write(&buf, testProfile(start)); err != nil {
		t.Fatal(err)
	}
	if b := buf.Bytes(); len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatal("output is not gzip")
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	period := (time.Second / 19).Nanoseconds()
	if p.Period != period || p.PeriodType.Type != "cpu" || p.PeriodType.Unit != "nanoseconds" {
		t.Errorf("period %d %v", p.Period, p.PeriodType)
	}
	if len(p.SampleType) != 2 || p.SampleType[0].Type != "samples" || p.SampleType[1].Unit != "nanoseconds" {
		t.Errorf("sample types %v", p.SampleType)
	}
	if p.TimeNanos != start.UnixNano() || p.DurationNanos != 10e9 {
		t.Errorf("time %d duration %d", p.TimeNanos, p.DurationNanos)
	}
	// The two processes map the same file at the same place: one pprof mapping, plus the kernel.
	if len(p.Mapping) != 2 {
		t.Errorf("got %d mappings, want 2", len(p.Mapping))
	}
	if len(p.Function) != 4 {
		t.Errorf("got %d functions, want 4 (inlined, leaf, main, do_syscall_64)", len(p.Function))
	}
	var kernelSeen bool
	for _, m := range p.Mapping {
		if m.File == trace.KernelPath {
			kernelSeen = true
		} else if m.BuildID != "abcd" || !m.HasFunctions {
			t.Errorf("app mapping %+v", m)
		}
	}
	if !kernelSeen {
		t.Error("no kernel mapping")
	}
	s := p.Sample[0]
	if s.Value[0] != 5 || s.Value[1] != 5*period {
		t.Errorf("values %v", s.Value)
	}
	if s.NumLabel["pid"][0] != 1 || s.NumLabel["tid"][0] != 1 || s.Label["thread_name"][0] != "app" || s.Label["process_name"][0] != "app" {
		t.Errorf("labels %v %v", s.Label, s.NumLabel)
	}
	if l := s.Location[0].Line; len(l) != 2 || l[0].Function.Name != "inlined" || l[1].Line != 10 {
		t.Errorf("inline lines %+v", l)
	}
	if un := p.Sample[1].Location[1]; un.Address != 0x400300 || len(un.Line) != 0 {
		t.Errorf("unnamed location %+v", un)
	}
}

func TestBuildMergesIntervals(t *testing.T) {
	start := time.Unix(1700000000, 0)
	a, b := testProfile(start), testProfile(start.Add(10*time.Second))
	p, err := Build(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Sample) != 4 || p.DurationNanos != 20e9 {
		t.Errorf("%d samples over %d ns", len(p.Sample), p.DurationNanos)
	}
	if len(p.Mapping) != 2 || len(p.Function) != 4 {
		t.Errorf("mappings %d functions %d: not shared across intervals", len(p.Mapping), len(p.Function))
	}
	if _, err := Build(); err == nil {
		t.Error("empty build succeeded")
	}
}

// What folded stacks give, no time, no period, samples without a process, writes and
// reads back without inventing any of them.
func TestWriteUntimedWithoutProcess(t *testing.T) {
	f := &trace.Location{Lines: []trace.Line{{Function: "f"}}}
	in := &trace.Profile{Locations: []*trace.Location{f}, Samples: []*trace.Sample{{Count: 3, Locations: []*trace.Location{f}}}}
	var buf bytes.Buffer
	if err := Write(&buf, in); err != nil {
		t.Fatal(err)
	}
	out, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Start.IsZero() || out.Period != 0 || len(out.Samples) != 1 {
		t.Fatalf("read back start %v, period %v, %d samples", out.Start, out.Period, len(out.Samples))
	}
	if s := out.Samples[0]; s.Process != nil || s.Count != 3 || s.Locations[0].Lines[0].Function != "f" {
		t.Errorf("sample read back: %+v", s)
	}
}

// A sample's span becomes the labels trace_id and span_id, its context attributes labels
// too, except one that would replace a label sonde sets.
func TestBuildLinkLabels(t *testing.T) {
	p := testProfile(time.Unix(1700000000, 0))
	s := p.Samples[0]
	s.Link.TraceID[0], s.Link.SpanID[7] = 0x4b, 0xb7
	s.Attributes = []trace.Attribute{{Key: "http.route", Value: "/cart"}, {Key: "thread_name", Value: "forged"}}
	out, err := Build(p)
	if err != nil {
		t.Fatal(err)
	}
	got := out.Sample[0].Label
	for k, want := range map[string]string{"trace_id": "4b000000000000000000000000000000", "span_id": "00000000000000b7", "http.route": "/cart", "thread_name": "app"} {
		if len(got[k]) != 1 || got[k][0] != want {
			t.Errorf("label %s = %v, want %s", k, got[k], want)
		}
	}
	if _, ok := out.Sample[1].Label["trace_id"]; ok {
		t.Errorf("a sample without a span has trace_id %v", out.Sample[1].Label["trace_id"])
	}
}
