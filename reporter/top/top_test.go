package top

import (
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/trace"
)

func TestRowsSelfAndCumulative(t *testing.T) {
	loc := func(names ...string) *trace.Location {
		l := &trace.Location{}
		for _, n := range names {
			l.Lines = append(l.Lines, trace.Line{Function: n})
		}
		return l
	}
	spin, rung, main := loc("spin"), loc("rung"), loc("main")
	inl := loc("inner", "rung") // inlined inner inside rung
	recursive := loc("rung")
	unnamed := &trace.Location{Address: 0x1234, Mapping: &trace.Mapping{Path: "/lib/x.so"}}
	p := &trace.Profile{Period: time.Millisecond, Start: time.Unix(0, 0), End: time.Unix(2, 0), Samples: []*trace.Sample{
		{Count: 6, Locations: []*trace.Location{spin, rung, main}},
		{Count: 3, Locations: []*trace.Location{inl, recursive, main}},
		{Count: 1, Locations: []*trace.Location{unnamed, main}},
	}}
	table := NewTable()
	table.Add(p)
	rows, total := table.Rows()
	if total != 10 {
		t.Fatalf("total %d", total)
	}
	got := map[string]Row{}
	for _, r := range rows {
		got[r.Name] = r
	}
	want := map[string]Row{
		"spin":               {"spin", 6, 6},
		"inner":              {"inner", 3, 3},
		"rung":               {"rung", 0, 9}, // counted once per sample despite recursion
		"main":               {"main", 0, 10},
		"0x1234 (/lib/x.so)": {"0x1234 (/lib/x.so)", 1, 1},
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: got %+v, want %+v", name, got[name], w)
		}
	}
	if rows[0].Name != "spin" || rows[1].Name != "inner" {
		t.Errorf("order: %v", rows)
	}
	var out strings.Builder
	if err := table.Print(&out, 2); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	if !strings.Contains(text, "10 samples") || !strings.Contains(text, " 60.00%  60.00%  spin") || strings.Contains(text, "main") {
		t.Errorf("printed:\n%s", text)
	}
}
