package merge

import (
	"regexp"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

// build makes a profile whose every pointer is fresh, as a file reader's would be.
func build(start time.Time, kind trace.FrameKind) *trace.Profile {
	file := &objfile.File{GNUBuildID: "abcd"}
	m := &trace.Mapping{Path: "/bin/app", File: file}
	loc := func(addr uint64, fn string) *trace.Location {
		return &trace.Location{Kind: kind, Address: addr, Mapping: m, Lines: []trace.Line{{Function: fn, File: "app.c", Line: int64(addr)}}}
	}
	main, work, spin := loc(1, "main"), loc(2, "work"), loc(3, "spin")
	app := &trace.Process{PID: 10, Name: "app"}
	other := &trace.Process{PID: 20, Name: "other"}
	return &trace.Profile{
		Start: start, End: start.Add(time.Second), Period: 10 * time.Millisecond,
		Locations: []*trace.Location{main, work, spin},
		Samples: []*trace.Sample{
			{Process: app, TID: 10, ThreadName: "app", Count: 3, Locations: []*trace.Location{spin, work, main}},
			{Process: app, TID: 11, ThreadName: "w", Count: 1, Locations: []*trace.Location{spin, work, main}},
			{Process: other, TID: 20, Count: 2, Locations: []*trace.Location{work, main},
				Timestamps: []time.Time{start, start.Add(time.Millisecond)}},
		},
	}
}

func TestMergeByValue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := build(t0, trace.FrameNative)
	b := build(t0.Add(5*time.Second), 0) // later, and from a format without frame kinds
	c := build(t0, trace.FrameNative)
	c.Locations[2].Address = 99 // spin at another address: another location
	got := Merge(a, nil, b, c)
	if !got.Start.Equal(t0) || !got.End.Equal(t0.Add(6*time.Second)) || got.Period != 10*time.Millisecond {
		t.Errorf("span %v..%v period %v", got.Start, got.End, got.Period)
	}
	if got.TotalCount() != 18 {
		t.Errorf("total %d, want 18", got.TotalCount())
	}
	// a and b merge fully; c's spin stack stays apart: 3 samples + 2 of c.
	if len(got.Samples) != 5 {
		t.Fatalf("%d samples, want 5", len(got.Samples))
	}
	if s := got.Samples[0]; s.Count != 6 || s.TID != 10 || s.Process.PID != 10 {
		t.Errorf("first sample %+v, want app's thread 10 with 3+3", s)
	}
	// other's stack does not pass spin: it merges across all three.
	if s := got.Samples[2]; s.Count != 6 || len(s.Timestamps) != 6 {
		t.Errorf("other's sample: count %d, %d timestamps; want 6 and 6", s.Count, len(s.Timestamps))
	}
	if len(got.Locations) != 4 {
		t.Errorf("%d locations, want 4 (main, work, spin at 3 and at 99)", len(got.Locations))
	}
	if len(a.Samples) != 3 || a.Samples[0].Count != 3 || len(a.Samples[2].Timestamps) != 2 {
		t.Error("Merge modified its input")
	}
}

func TestMergeKeepsThreadsAndProcessesApart(t *testing.T) {
	a := build(time.Unix(0, 0), trace.FrameNative)
	b := build(time.Unix(0, 0), trace.FrameNative)
	b.Samples[0].ThreadName = "renamed"
	b.Samples[1].Process = &trace.Process{PID: 10, Name: "app2"}
	b.Samples[2].Process = nil
	got := Merge(a, b)
	if len(got.Samples) != 6 {
		t.Errorf("%d samples, want 6: a thread or process that differs is another sample", len(got.Samples))
	}
}

func TestFilter(t *testing.T) {
	p := build(time.Unix(0, 0), trace.FrameNative)
	unnamed := &trace.Location{Address: 0xbeef, Mapping: &trace.Mapping{Path: "/lib/x.so"}}
	p.Locations = append(p.Locations, unnamed)
	p.Samples = append(p.Samples, &trace.Sample{Process: p.Samples[0].Process, Count: 5, Locations: []*trace.Location{unnamed}})
	for _, tc := range []struct {
		name   string
		f      Filter
		total  int64
		nLocs  int
		nSampl int
	}{
		{"none", Filter{}, 11, 4, 4},
		{"focus spin", Filter{Focus: regexp.MustCompile(`^spin$`)}, 4, 3, 2},
		{"focus work", Filter{Focus: regexp.MustCompile(`wor`)}, 6, 3, 3},
		{"focus unnamed", Filter{Focus: regexp.MustCompile(`x\.so`)}, 5, 1, 1},
		{"focus nothing", Filter{Focus: regexp.MustCompile(`nothing`)}, 0, 0, 0},
		{"pid", Filter{PIDs: []uint32{20}}, 2, 2, 1},
		{"pids", Filter{PIDs: []uint32{20, 10}}, 11, 4, 4},
		{"pid and focus", Filter{PIDs: []uint32{10}, Focus: regexp.MustCompile(`main`)}, 4, 3, 2},
	} {
		got := tc.f.Apply(p)
		if got.TotalCount() != tc.total || len(got.Locations) != tc.nLocs || len(got.Samples) != tc.nSampl {
			t.Errorf("%s: total %d, %d locations, %d samples; want %d, %d, %d", tc.name,
				got.TotalCount(), len(got.Locations), len(got.Samples), tc.total, tc.nLocs, tc.nSampl)
		}
	}
}

// A Merger fed interval by interval holds the same as Merge of them all, and past its
// bound it counts what it leaves out instead of growing.
func TestMergerIncrementalAndBounded(t *testing.T) {
	a, b := mergeTestProfile(t, 0), mergeTestProfile(t, 1)
	m := NewMerger(0)
	m.Add(a)
	m.Add(b)
	whole := Merge(a, b)
	if m.Profile().TotalCount() != whole.TotalCount() || len(m.Profile().Samples) != len(whole.Samples) {
		t.Errorf("incremental %d samples in %d, Merge %d in %d", m.Profile().TotalCount(), len(m.Profile().Samples), whole.TotalCount(), len(whole.Samples))
	}
	bounded := NewMerger(1)
	bounded.Add(a)
	bounded.Add(b)
	if len(bounded.Profile().Samples) != 1 || bounded.Dropped() == 0 || bounded.Profile().TotalCount()+bounded.Dropped() != whole.TotalCount() {
		t.Errorf("bound 1: %d samples kept, %d dropped, of %d", len(bounded.Profile().Samples), bounded.Dropped(), whole.TotalCount())
	}
}

func mergeTestProfile(t *testing.T, shift uint64) *trace.Profile {
	t.Helper()
	m := &trace.Mapping{Start: 0x1000, End: 0x9000, Path: "/bin/x"}
	var locs []*trace.Location
	for i := range 3 {
		locs = append(locs, &trace.Location{Kind: trace.FrameNative, Address: 0x1000 + uint64(i)*16 + shift*64, Mapping: m})
	}
	proc := &trace.Process{PID: 1, Name: "x"}
	return &trace.Profile{Locations: locs, Samples: []*trace.Sample{
		{Process: proc, TID: 1, Locations: locs[:2], Count: 3},
		{Process: proc, TID: 1, Locations: locs[1:], Count: 2},
	}}
}
