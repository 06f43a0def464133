package trace

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/tracectx"
	"golang.org/x/sys/unix"
)

// mapsLine is one line of /proc/PID/maps.
type mapsLine struct {
	Start, End, Offset uint64
	Perms              string
	Dev                uint64 // makedev(major, minor) in the kernel's encoding for stat
	Inode              uint64
	Path               string
}

// maxMapsLine bounds one line: a path is at most PATH_MAX (4096) bytes, which the kernel
// may escape to four bytes per byte.
const maxMapsLine = 20 << 10

// readMapsFile reads a process's executable mappings from its maps file, and where its
// OpenTelemetry process context is (0: nowhere).
func readMapsFile(path string) ([]mapsLine, uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	return parseMapsContext(f)
}

// parseMaps reads /proc/PID/maps, keeping only executable mappings: only they hold code a
// stack can return to.
func parseMaps(r io.Reader) ([]mapsLine, error) {
	out, _, err := parseMapsContext(r)
	return out, err
}

// parseMapsContext is parseMaps that also notes the first mapping named as an
// OpenTelemetry process context (OTEP 4719) holds, which is not executable.
func parseMapsContext(r io.Reader) ([]mapsLine, uint64, error) {
	var out []mapsLine
	var ctxAddr uint64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxMapsLine)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" {
			continue
		}
		m, err := parseMapsLine(line)
		if err != nil {
			return nil, 0, fmt.Errorf("maps line %d: %w", n, err)
		}
		if strings.Contains(m.Perms, "x") && len(out) < maxExecMappings {
			out = append(out, m)
		}
		if ctxAddr == 0 && strings.HasPrefix(m.Perms, "r") && tracectx.IsContextMapping(m.Path) {
			ctxAddr = m.Start
		}
	}
	if err := sc.Err(); err != nil {
		return nil, 0, fmt.Errorf("read maps: %w", err)
	}
	return out, ctxAddr, nil
}

// parseMapsLine parses "start-end perms offset major:minor inode   path".
func parseMapsLine(line string) (mapsLine, error) {
	var m mapsLine
	fields := strings.Fields(line)
	if len(fields) < 5 {
		return m, fmt.Errorf("%q: want at least 5 fields", line)
	}
	lo, hi, ok := strings.Cut(fields[0], "-")
	if !ok {
		return m, fmt.Errorf("%q: bad address range", line)
	}
	var err error
	if m.Start, err = strconv.ParseUint(lo, 16, 64); err != nil {
		return m, fmt.Errorf("%q: start: %w", line, err)
	}
	if m.End, err = strconv.ParseUint(hi, 16, 64); err != nil {
		return m, fmt.Errorf("%q: end: %w", line, err)
	}
	if m.End < m.Start {
		return m, fmt.Errorf("%q: end before start", line)
	}
	m.Perms = fields[1]
	if m.Offset, err = strconv.ParseUint(fields[2], 16, 64); err != nil {
		return m, fmt.Errorf("%q: offset: %w", line, err)
	}
	major, minor, ok := strings.Cut(fields[3], ":")
	if !ok {
		return m, fmt.Errorf("%q: bad device", line)
	}
	maj, err1 := strconv.ParseUint(major, 16, 32)
	mnr, err2 := strconv.ParseUint(minor, 16, 32)
	if err1 != nil || err2 != nil {
		return m, fmt.Errorf("%q: bad device", line)
	}
	m.Dev = mkdev(maj, mnr)
	if m.Inode, err = strconv.ParseUint(fields[4], 10, 64); err != nil {
		return m, fmt.Errorf("%q: inode: %w", line, err)
	}
	// Paths may contain spaces; take everything after the fifth column.
	rest := line
	for range 5 {
		rest = strings.TrimLeft(rest, " \t")
		rest = rest[strings.IndexAny(rest+" ", " \t"):]
	}
	// Kept as the bytes the kernel gave: the path opens the file. Mapping.Path, which
	// reporters print, is made valid UTF-8.
	m.Path = strings.TrimSpace(rest)
	return m, nil
}

// mkdev encodes a device number the way glibc's makedev does, matching stat's st_dev.
func mkdev(major, minor uint64) uint64 {
	return (major&0xfffff000)<<32 | (major&0xfff)<<8 | (minor&0xffffff00)<<12 | minor&0xff
}

// statKey stats path (following links) into a file key.
func statKey(path string, k *objfile.Key) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return err
	}
	*k = objfile.Key{Dev: st.Dev, Inode: st.Ino}
	return nil
}
