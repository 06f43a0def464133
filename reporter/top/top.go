// Package top prints the short terminal summary of a profile: the functions with the most
// samples, by self and cumulative share. Names are escaped (control bytes, terminal
// escapes, invalid UTF-8) before they reach a terminal.
package top

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sonde-profiler/sonde/reporter/internal/frames"
	"github.com/sonde-profiler/sonde/trace"
)

// Row is one function's share of the samples.
type Row struct {
	Name      string // printable: see Printable
	Self, Cum int64
}

// Table accumulates per-function counts over any number of intervals; its memory grows
// with the number of distinct functions, not with samples or intervals.
type Table struct {
	// Time names what the samples' time is in the summary: "CPU" when empty; "waiting"
	// or "wall time" for tables of off-CPU or wall views.
	Time       string
	byName     map[string]*Row
	total      int64
	period     time.Duration
	start, end time.Time
	seen       map[string]bool
	names      []string // a location's frame names, reused from one to the next
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{byName: map[string]*Row{}, seen: map[string]bool{}}
}

// Add counts a profile's samples. Every interval of a run is to be added, idle ones
// too: the table's time span is that of what was added, samples or not.
func (t *Table) Add(p *trace.Profile) {
	t.extend(p.Start, p.End)
	if p.Period > 0 {
		t.period = p.Period
	}
	for _, s := range p.Samples {
		t.total += s.Count
		clear(t.seen)
		first := true
		for _, l := range s.Locations {
			if l == nil {
				continue
			}
			t.names = appendFrameNames(t.names[:0], l)
			for _, name := range t.names {
				if first {
					t.row(name).Self += s.Count
					first = false
				}
				if !t.seen[name] {
					t.seen[name] = true
					t.row(name).Cum += s.Count
				}
			}
		}
	}
}

// extend widens the span to [start, end); profiles without a time (folded stacks) leave
// it as it is.
func (t *Table) extend(start, end time.Time) {
	if !start.IsZero() && (t.start.IsZero() || start.Before(t.start)) {
		t.start = start
	}
	if end.After(t.end) {
		t.end = end
	}
}

// merge adds o's counts and span to t.
func (t *Table) merge(o *Table) {
	t.extend(o.start, o.end)
	if o.period > 0 {
		t.period = o.period
	}
	t.total += o.total
	for name, r := range o.byName {
		tr := t.row(name)
		tr.Self += r.Self
		tr.Cum += r.Cum
	}
}

func (t *Table) row(name string) *Row {
	r, ok := t.byName[name]
	if !ok {
		r = &Row{Name: name}
		t.byName[name] = r
	}
	return r
}

// Rows ranks functions by self samples, then cumulative, then name.
func (t *Table) Rows() (rows []Row, total int64) {
	for _, r := range t.byName {
		rows = append(rows, *r)
	}
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(b.Self, a.Self), cmp.Compare(b.Cum, a.Cum), cmp.Compare(a.Name, b.Name))
	})
	return rows, t.total
}

// SortByCum ranks rows by cumulative samples, then self, then name.
func SortByCum(rows []Row) {
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(b.Cum, a.Cum), cmp.Compare(b.Self, a.Self), cmp.Compare(a.Name, b.Name))
	})
}

// Span is the time the added profiles cover; zero when none had a time.
func (t *Table) Span() time.Duration {
	if t.start.IsZero() || !t.end.After(t.start) {
		return 0
	}
	return t.end.Sub(t.start)
}

// Period is the CPU time one sample stands for; zero when unknown.
func (t *Table) Period() time.Duration { return t.period }

// appendFrameNames appends the names of a location's frames to names, innermost first,
// made printable; unnamed code shows its address and file, as in the flame graphs and
// folded stacks.
func appendFrameNames(names []string, l *trace.Location) []string {
	if len(l.Lines) == 0 {
		return append(names, frames.Clean(frames.Unnamed(l)))
	}
	for _, line := range l.Lines {
		name := line.Function
		if name == "" {
			name = frames.Unnamed(l)
		}
		names = append(names, frames.Clean(name))
	}
	return names
}

// Printable makes s safe to write to a terminal as the table's names are: invalid UTF-8
// becomes U+FFFD; control characters (newlines, terminal escapes), line separators and
// bidirectional controls become visible \xNN or \uNNNN escapes.
func Printable(s string) string { return frames.Clean(s) }

// Summary is the line above the table: samples, the CPU time they stand for, and the
// time span, each when known.
func (t *Table) Summary() string {
	var b strings.Builder
	if t.total == 0 {
		b.WriteString("no samples")
	} else {
		fmt.Fprintf(&b, "%d samples", t.total)
	}
	if t.total > 0 && t.period > 0 {
		fmt.Fprintf(&b, " (%.2fs of %s)", (time.Duration(t.total) * t.period).Seconds(), cmp.Or(t.Time, "CPU"))
	}
	if span := t.Span(); span > 0 {
		fmt.Fprintf(&b, " over %.1fs", span.Seconds())
	}
	return b.String()
}

// Header is the table's column heading.
const Header = "  self%    cum%  function"

// Lines formats rows, one line each: self and cumulative shares of total and the
// function's name. With width > 0 a line is cut to width columns, the name ending in
// "…" where it was cut (names are counted a rune to a column).
func Lines(rows []Row, total int64, width int) []string {
	lines := make([]string, 0, len(rows))
	pct := func(v int64) float64 {
		if total == 0 {
			return 0
		}
		return 100 * float64(v) / float64(total)
	}
	for _, r := range rows {
		prefix := fmt.Sprintf("%6.2f%% %6.2f%%  ", pct(r.Self), pct(r.Cum))
		lines = append(lines, prefix+fit(r.Name, width-len(prefix), width > 0))
	}
	return lines
}

// fit cuts s to at most n runes when limit is set.
func fit(s string, n int, limit bool) string {
	if !limit || utf8.RuneCountInString(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	runes := []rune(s)
	return string(runes[:n-1]) + "…"
}

// Print writes the summary line and the n functions with the most self samples.
func (t *Table) Print(w io.Writer, n int) error {
	rows, total := t.Rows()
	if _, err := fmt.Fprintln(w, t.Summary()); err != nil || total == 0 {
		return err
	}
	fmt.Fprintln(w, Header)
	for _, line := range Lines(rows[:min(n, len(rows))], total, 0) {
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

// Window is a table of the most recent intervals only, for a live view: an interval is
// dropped once it ended more than the window's span before the newest one.
type Window struct {
	span      time.Duration
	intervals []*Table
}

// NewWindow returns an empty window of the given span.
func NewWindow(span time.Duration) *Window { return &Window{span: span} }

// Add counts an interval and drops those that fell out of the window.
func (w *Window) Add(p *trace.Profile) {
	t := NewTable()
	t.Add(p)
	w.intervals = append(w.intervals, t)
	cut := p.End.Add(-w.span)
	i := 0
	for i < len(w.intervals)-1 && !w.intervals[i].end.After(cut) {
		i++
	}
	w.intervals = slices.Delete(w.intervals, 0, i)
}

// Table sums the intervals in the window into a new table.
func (w *Window) Table() *Table {
	t := NewTable()
	for _, it := range w.intervals {
		t.merge(it)
	}
	return t
}
