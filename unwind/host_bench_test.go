package unwind

import (
	"bufio"
	"debug/elf"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hostExecutableFiles lists the distinct files mapped executable by any process on the host.
func hostExecutableFiles() []string {
	seen := map[string]bool{}
	mapsFiles, _ := filepath.Glob("/proc/[0-9]*/maps")
	for _, mf := range mapsFiles {
		f, err := os.Open(mf)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) >= 6 && strings.Contains(fields[1], "x") && strings.HasPrefix(fields[5], "/") {
				seen[fields[5]] = true
			}
		}
		f.Close()
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	return out
}

// BenchmarkHostTables builds the table of every file mapped executable on this host: the
// kernel memory sonde's unwinder needs to cover the whole host, at 12 bytes a row.
func BenchmarkHostTables(b *testing.B) {
	files := hostExecutableFiles()
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
