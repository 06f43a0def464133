package top

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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

// A run's idle intervals are part of its span: three 10 s intervals, samples in one.
func TestSpanCountsIdleIntervals(t *testing.T) {
	start := time.Unix(1000, 0)
	busy := &trace.Location{Lines: []trace.Line{{Function: "busy"}}}
	table := NewTable()
	for i := range 3 {
		p := &trace.Profile{Period: 10 * time.Millisecond, Start: start.Add(time.Duration(i) * 10 * time.Second), End: start.Add(time.Duration(i+1) * 10 * time.Second)}
		if i == 1 {
			p.Samples = []*trace.Sample{{Count: 4, Locations: []*trace.Location{busy}}}
		}
		table.Add(p)
	}
	if got := table.Span(); got != 30*time.Second {
		t.Errorf("span %v, want 30s", got)
	}
	var out strings.Builder
	if err := table.Print(&out, 5); err != nil {
		t.Fatal(err)
	}
	if first := strings.SplitN(out.String(), "\n", 2)[0]; first != "4 samples (0.04s of CPU) over 30.0s" {
		t.Errorf("summary %q", first)
	}
	idle := NewTable()
	idle.Add(&trace.Profile{Start: start, End: start.Add(5 * time.Second)})
	if got := idle.Summary(); got != "no samples over 5.0s" {
		t.Errorf("idle summary %q", got)
	}
	// Folded stacks carry neither time nor period: the summary says only what it knows.
	untimed := NewTable()
	untimed.Add(&trace.Profile{Samples: []*trace.Sample{{Count: 3, Locations: []*trace.Location{busy}}}})
	if got := untimed.Summary(); got != "3 samples" {
		t.Errorf("untimed summary %q", got)
	}
}

// Names reach the terminal escaped: a function or file name cannot move the cursor,
// change colours or end a line.
func TestNamesAreEscaped(t *testing.T) {
	evil := &trace.Location{Lines: []trace.Line{{Function: "x\x1b[2J\x1b]0;owned\x07\nfake 99.00%"}}}
	unnamed := &trace.Location{Address: 0x10, Mapping: &trace.Mapping{Path: "/tmp/\x1b[31mlib\xff.so"}}
	table := NewTable()
	table.Add(&trace.Profile{Samples: []*trace.Sample{
		{Count: 2, Locations: []*trace.Location{evil}},
		{Count: 1, Locations: []*trace.Location{unnamed}},
	}})
	var out strings.Builder
	if err := table.Print(&out, 5); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, b := range []byte(text) {
		if b < 0x20 && b != '\n' || b == 0x7f {
			t.Fatalf("control byte %#x reached the output:\n%q", b, text)
		}
	}
	if n := strings.Count(text, "\n"); n != 4 {
		t.Errorf("%d lines, want 4 (summary, header, two rows):\n%s", n, text)
	}
	if !strings.Contains(text, `x\x1b[2J\x1b]0;owned\x07\x0afake 99.00%`) || !strings.Contains(text, `0x10 (/tmp/\x1b[31mlib`+"\uFFFD"+`.so)`) {
		t.Errorf("names not escaped visibly:\n%s", text)
	}
}

func TestLinesFitTheWidth(t *testing.T) {
	rows := []Row{{Name: "short", Self: 1, Cum: 2}, {Name: strings.Repeat("é", 100), Self: 1, Cum: 1}}
	lines := Lines(rows, 2, 40)
	if lines[0] != " 50.00% 100.00%  short" {
		t.Errorf("line %q", lines[0])
	}
	if n := utf8.RuneCountInString(lines[1]); n != 40 || !strings.HasSuffix(lines[1], "é…") {
		t.Errorf("long name cut to %d runes: %q", n, lines[1])
	}
	SortByCum(rows)
	if rows[0].Name != "short" {
		t.Errorf("by cumulative: %v", rows)
	}
}

// A window keeps the intervals that ended within its span of the newest.
func TestWindowSlides(t *testing.T) {
	start := time.Unix(0, 0)
	interval := func(i int, name string, n int64) *trace.Profile {
		return &trace.Profile{Period: time.Millisecond, Start: start.Add(time.Duration(i) * time.Second), End: start.Add(time.Duration(i+1) * time.Second),
			Samples: []*trace.Sample{{Count: n, Locations: []*trace.Location{{Lines: []trace.Line{{Function: name}}}}}}}
	}
	w := NewWindow(3 * time.Second)
	for i, name := range []string{"old", "mid", "new", "newer"} {
		w.Add(interval(i, name, int64(i+1)))
	}
	rows, total := w.Table().Rows()
	if total != 2+3+4 {
		t.Errorf("total %d, want 9 (old fell out)", total)
	}
	for _, r := range rows {
		if r.Name == "old" {
			t.Errorf("old interval still in the window: %v", rows)
		}
	}
	if rows[0].Name != "newer" || w.Table().Span() != 3*time.Second {
		t.Errorf("rows %v, span %v", rows, w.Table().Span())
	}
}
