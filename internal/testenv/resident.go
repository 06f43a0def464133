package testenv

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// Resident sums the resident memory of this process's mappings that match says to
// count, from /proc/self/smaps: a test's measure of what a reader of mapped files keeps.
func Resident(t testing.TB, match func(start, end uint64, path string) bool) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	in := false
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			lo, hi, _ := strings.Cut(f[0], "-")
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			path := ""
			if len(f) >= 6 {
				path = f[5]
			}
			in = err1 == nil && err2 == nil && match(start, end, path)
		case in && len(f) >= 2 && f[0] == "Rss:":
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			total += kb << 10
		}
	}
	return total
}
