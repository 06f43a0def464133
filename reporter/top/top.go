// Package top prints the short terminal summary of a profile: the functions with the most
// samples, by self and cumulative share.
package top

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/sonde-profiler/sonde/trace"
)

// Row is one function's share of the samples.
type Row struct {
	Name      string
	Self, Cum int64
}

// Table accumulates per-function counts over any number of intervals; its memory grows
// with the number of distinct functions, not with samples or intervals.
type Table struct {
	byName     map[string]*Row
	total      int64
	period     time.Duration
	start, end time.Time
	seen       map[string]bool
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{byName: map[string]*Row{}, seen: map[string]bool{}}
}

// Add counts a profile's samples.
func (t *Table) Add(p *trace.Profile) {
	if t.start.IsZero() || p.Start.Before(t.start) {
		t.start = p.Start
	}
	if p.End.After(t.end) {
		t.end = p.End
	}
	t.period = p.Period
	for _, s := range p.Samples {
		t.total += s.Count
		clear(t.seen)
		for i, l := range s.Locations {
			for j, name := range frameNames(l) {
				if i == 0 && j == 0 {
					t.row(name).Self += s.Count
				}
				if !t.seen[name] {
					t.seen[name] = true
					t.row(name).Cum += s.Count
				}
			}
		}
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

// frameNames names a location's frames innermost first; unnamed code shows its address and file.
func frameNames(l *trace.Location) []string {
	if len(l.Lines) == 0 {
		if l.Mapping != nil && l.Mapping.Path != "" {
			return []string{fmt.Sprintf("%#x (%s)", l.Address, l.Mapping.Path)}
		}
		return []string{fmt.Sprintf("%#x", l.Address)}
	}
	names := make([]string, len(l.Lines))
	for i, line := range l.Lines {
		names[i] = line.Function
	}
	return names
}

// Print writes the n functions with the most self samples.
func (t *Table) Print(w io.Writer, n int) error {
	rows, total := t.Rows()
	if total == 0 {
		_, err := fmt.Fprintln(w, "no samples")
		return err
	}
	cpu := time.Duration(total) * t.period
	fmt.Fprintf(w, "%d samples (%.2fs of CPU) over %.1fs\n", total, cpu.Seconds(), t.end.Sub(t.start).Seconds())
	fmt.Fprintf(w, "%7s %7s  %s\n", "self%", "cum%", "function")
	for _, r := range rows[:min(n, len(rows))] {
		pct := func(v int64) float64 { return 100 * float64(v) / float64(total) }
		if _, err := fmt.Fprintf(w, "%6.2f%% %6.2f%%  %s\n", pct(r.Self), pct(r.Cum), r.Name); err != nil {
			return err
		}
	}
	return nil
}
