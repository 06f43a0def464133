package unwind

import (
	"debug/elf"
	"testing"
)

// BenchmarkHostTables builds the table of every file mapped executable on this host: the
// kernel memory sonde's unwinder needs to cover the whole host, at 12 bytes a row.
func BenchmarkHostTables(b *testing.B) {
	files := MappedExecutables("/proc", nil)
	if len(files) == 0 {
		b.Skip("no readable /proc/*/maps")
	}
	for b.Loop() {
		rows, built := 0, 0
		for _, p := range files {
			ef, err := elf.Open(p)
			if err != nil {
				continue
			}
			t, err := FromELF(ef)
			ef.Close()
			if err != nil {
				continue
			}
			rows += len(t.Rows)
			built++
		}
		b.ReportMetric(float64(built), "files")
		b.ReportMetric(float64(rows), "rows")
		b.ReportMetric(float64(rows*12)/(1<<20), "MiB")
	}
}
