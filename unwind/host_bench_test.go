package unwind

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// hostFiles lists one path to each distinct file some process on this host maps, through
// /proc/PID/map_files, which reaches the very file mapped.
func hostFiles() []string {
	links, _ := filepath.Glob("/proc/[0-9]*/map_files/*")
	seen := map[objfile.Key]bool{}
	var out []string
	for _, l := range links {
		var st unix.Stat_t
		if unix.Stat(l, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		if k := (objfile.Key{Dev: st.Dev, Inode: st.Ino}); !seen[k] {
			seen[k] = true
			out = append(out, l)
		}
	}
	return out
}

// BenchmarkHostTables builds the table of every file mapped on this host: the kernel
// memory sonde's unwinder needs to cover the whole host, at 16 bytes a row (the kernel
// rounds the 12-byte row up to 8-byte alignment).
func BenchmarkHostTables(b *testing.B) {
	files := hostFiles()
	if len(files) == 0 {
		b.Skip("no readable /proc/*/map_files")
	}
	for b.Loop() {
		rows, built := 0, 0
		for _, p := range files {
			h, err := objfile.OpenHost(p)
			if err != nil {
				continue
			}
			t, err := Read(h)
			h.Close()
			if err != nil {
				continue
			}
			rows += len(t.Rows)
			built++
		}
		b.ReportMetric(float64(built), "files")
		b.ReportMetric(float64(rows), "rows")
		b.ReportMetric(float64(rows*16)/(1<<20), "MiB")
	}
}
