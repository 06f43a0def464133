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

// Rows ranks functions by self samples, then cumulative, then name.
func Rows(profiles ...*trace.Profile) (rows []Row, total int64) {
	byName := map[string]*Row{}
	row := func(name string) *Row {
		r, ok := byName[name]
		if !ok {
			r = &Row{Name: name}
			byName[name] = r
		}
		return r
	}
	seen := map[string]bool{}
	for _, p := range profiles {
		for _, s := range p.Samples {
			total += s.Count
			clear(seen)
			for i, l := range s.Locations {
				for j, name := range frameNames(l) {
					if i == 0 && j == 0 {
						row(name).Self += s.Count
					}
					if !seen[name] {
						seen[name] = true
						row(name).Cum += s.Count
					}
				}
			}
		}
	}
	for _, r := range byName {
		rows = append(rows, *r)
	}
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(b.Self, a.Self), cmp.Compare(b.Cum, a.Cum), cmp.Compare(a.Name, b.Name))
	})
	return rows, total
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
func Print(w io.Writer, n int, profiles ...*trace.Profile) error {
	rows, total := Rows(profiles...)
	if total == 0 {
		_, err := fmt.Fprintln(w, "no samples")
		return err
	}
	first, last := profiles[0], profiles[len(profiles)-1]
	cpu := time.Duration(total) * first.Period
	fmt.Fprintf(w, "%d samples (%.2fs of CPU) over %.1fs\n", total, cpu.Seconds(), last.End.Sub(first.Start).Seconds())
	fmt.Fprintf(w, "%7s %7s  %s\n", "self%", "cum%", "function")
	for _, r := range rows[:min(n, len(rows))] {
		pct := func(v int64) float64 { return 100 * float64(v) / float64(total) }
		if _, err := fmt.Fprintf(w, "%6.2f%% %6.2f%%  %s\n", pct(r.Self), pct(r.Cum), r.Name); err != nil {
			return err
		}
	}
	return nil
}
