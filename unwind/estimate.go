package unwind

import (
	"bufio"
	"debug/elf"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MappedExecutables lists the distinct files that processes map executable: the given
// pids, or every process when pids is empty.
func MappedExecutables(procFS string, pids []uint32) []string {
	var mapsFiles []string
	if len(pids) == 0 {
		mapsFiles, _ = filepath.Glob(filepath.Join(procFS, "[0-9]*", "maps"))
	}
	for _, pid := range pids {
		mapsFiles = append(mapsFiles, filepath.Join(procFS, strconv.FormatUint(uint64(pid), 10), "maps"))
	}
	seen := map[string]bool{}
	var out []string
	for _, mf := range mapsFiles {
		f, err := os.Open(mf)
		if err != nil {
			continue // gone already
		}
		root := filepath.Join(filepath.Dir(mf), "root")
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 6 || !strings.Contains(fields[1], "x") || !strings.HasPrefix(fields[5], "/") {
				continue
			}
			key := fields[3] + " " + fields[4] // device and inode
			if !seen[key] {
				seen[key] = true
				out = append(out, filepath.Join(root, fields[5]))
			}
		}
		f.Close()
	}
	return out
}

// Bounds of EstimateRows: the floor leaves room for processes started later on a quiet
// host; the ceiling keeps the map at 192 MiB of kernel memory whatever the host runs.
const (
	minEstimatedRows = 1 << 18
	maxEstimatedRows = 16 << 20
)

// EstimateRows sizes the kernel's unwind table for files from their .eh_frame sections
// without parsing them: compilers' call frame information takes 5 to 6 bytes a row, so
// size/4 over-counts a little, and the total is doubled for code loaded later. Go
// binaries are left out: they are walked by frame pointer.
func EstimateRows(paths []string) int {
	rows := 0
	for _, p := range paths {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		if f.Section(".gopclntab") == nil && f.Section(".go.buildinfo") == nil {
			if s := f.Section(".eh_frame"); s != nil {
				rows += int(s.Size / 4)
			} else if s := f.Section(".debug_frame"); s != nil {
				rows += int(s.Size / 4)
			}
		}
		f.Close()
	}
	return min(max(2*rows, minEstimatedRows), maxEstimatedRows)
}
