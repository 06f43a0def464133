package folded_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/reporter/folded"
	"github.com/sonde-profiler/sonde/reporter/merge"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/reporter/pprof"
	"github.com/sonde-profiler/sonde/trace"
)

// roundTripProfile has what each format must carry through: processes with the same
// name, threads, inlined lines, kernel and unnamed frames, names with the characters
// folded stacks escape. (Not invalid UTF-8: OTLP's protobuf strings refuse it.)
func roundTripProfile() *trace.Profile {
	start := time.Unix(1700000000, 0)
	exe := &objfile.File{Path: "/usr/bin/app", GNUBuildID: "0123abcd"}
	m := &trace.Mapping{Start: 0x400000, End: 0x500000, Offset: 0x1000, Path: "/usr/bin/app", File: exe}
	kernel := &trace.Mapping{Start: 0xffff800000000000, End: ^uint64(0), Path: trace.KernelPath}
	loc := func(kind trace.FrameKind, mp *trace.Mapping, addr uint64, names ...string) *trace.Location {
		l := &trace.Location{Kind: kind, Address: addr, Mapping: mp}
		for i, n := range names {
			l.Lines = append(l.Lines, trace.Line{Function: n, SystemName: "_Z" + n, File: "app.cc", Line: int64(10 + i)})
		}
		return l
	}
	main := loc(trace.FrameNative, m, 0x400100, "main")
	work := loc(trace.FrameNative, m, 0x400200, "helper", "work")
	spin := loc(trace.FrameNative, m, 0x400300, "spin")
	odd := loc(trace.FrameNative, m, 0x400400, "operator<<(std::ostream&; int)", "tab\there\nnewline")
	unnamed := loc(trace.FrameNative, m, 0x400500)
	sys := loc(trace.FrameKernel, kernel, 0xffffffff81000010, "do_syscall_64")
	a := &trace.Process{PID: 100, Name: "app", ExePath: "/usr/bin/app"}
	b := &trace.Process{PID: 101, Name: "app", ExePath: "/usr/bin/app"}
	return &trace.Profile{
		Start: start, End: start.Add(10 * time.Second), Period: time.Second / 99,
		Locations: []*trace.Location{main, work, spin, odd, unnamed, sys},
		Samples: []*trace.Sample{
			{Process: a, TID: 100, ThreadName: "app", Count: 40, Locations: []*trace.Location{spin, work, main}},
			{Process: a, TID: 102, ThreadName: "worker", Count: 15, Locations: []*trace.Location{spin, work, main}},
			{Process: a, TID: 100, ThreadName: "app", Count: 7, Locations: []*trace.Location{sys, unnamed, main}},
			{Process: b, TID: 101, ThreadName: "app", Count: 9, Locations: []*trace.Location{odd, work, main}},
			{Process: b, TID: 101, ThreadName: "app", Count: 1, Locations: []*trace.Location{main}},
		},
	}
}

// TestRoundTrip carries a profile through every format sonde view reads: pprof, then
// OTLP (binary and JSON), then folded stacks; the stacks and counts must survive.
func TestRoundTrip(t *testing.T) {
	orig := roundTripProfile()
	var want bytes.Buffer
	if err := folded.Write(&want, orig); err != nil {
		t.Fatal(err)
	}

	var pb bytes.Buffer
	if err := pprof.Write(&pb, orig); err != nil {
		t.Fatal(err)
	}
	fromPprof, err := pprof.Read(&pb)
	if err != nil {
		t.Fatal(err)
	}
	req := otlp.Encode([]*trace.Profile{fromPprof}, otlp.Resource{HostName: "box"}, otlp.EncodeOptions{})
	bin, err := proto.Marshal(&profilespb.ProfilesData{ResourceProfiles: req.ResourceProfiles, Dictionary: req.Dictionary})
	if err != nil {
		t.Fatal(err)
	}
	js, err := otlp.MarshalJSON(req)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data []byte
		json bool
	}{{"otlp.pb", bin, false}, {"otlp.json", js, true}} {
		t.Run(tc.name, func(t *testing.T) {
			fromOTLP, err := otlp.Decode(tc.data, tc.json)
			if err != nil {
				t.Fatal(err)
			}
			var text bytes.Buffer
			if err := folded.Write(&text, merge.Merge(fromOTLP...)); err != nil {
				t.Fatal(err)
			}
			fromFolded, err := folded.Read(&text)
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			if err := folded.Write(&got, fromFolded); err != nil {
				t.Fatal(err)
			}
			if got.String() != want.String() {
				t.Errorf("pprof → OTLP → folded changed the stacks:\ngot:\n%s\nwant:\n%s", got.String(), want.String())
			}
			if fromFolded.TotalCount() != orig.TotalCount() {
				t.Errorf("total %d, want %d", fromFolded.TotalCount(), orig.TotalCount())
			}
		})
	}
	// The expected text itself: one line per stack and process, inlined frames last.
	for _, line := range []string{
		"app-100;main;work;helper;spin 55\n",
		`app-101;main;work;helper;tab\x09here\x0anewline;operator<<(std::ostream&\x3b int) 9` + "\n",
		"app-100;main;0x400500 (/usr/bin/app);do_syscall_64 7\n",
	} {
		if !strings.Contains(want.String(), line) {
			t.Errorf("folded output lacks %q:\n%s", line, want.String())
		}
	}
}
