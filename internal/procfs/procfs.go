// Package procfs parses what the kernel's /proc says of processes and mounts: the lines of
// /proc/PID/maps, the mount table of /proc/PID/mountinfo, the page counts of
// /proc/PID/statm. It is the one reader of them: what a process's maps file holds is the
// process's to write (its paths), and is parsed as hostile.
package procfs

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End, Offset uint64
	Perms              string
	Dev                uint64 // makedev(major, minor) in the kernel's encoding for stat
	Inode              uint64
	// Path is the bytes the kernel gave, which open the file: whoever prints it makes it
	// valid UTF-8 first.
	Path string
}

// MaxLine bounds one line of a maps file: a path is at most PATH_MAX (4096) bytes, which
// the kernel may escape to four bytes per byte.
const MaxLine = 20 << 10

// ScanMaps calls fn with each mapping of a maps file, in order, until fn returns false;
// a line that does not parse is an error that says which.
func ScanMaps(r io.Reader, fn func(Mapping) bool) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), MaxLine)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" {
			continue
		}
		m, err := ParseMapsLine(line)
		if err != nil {
			return fmt.Errorf("maps line %d: %w", n, err)
		}
		if !fn(m) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read maps: %w", err)
	}
	return nil
}

// ParseMapsLine parses "start-end perms offset major:minor inode   path".
func ParseMapsLine(line string) (Mapping, error) {
	var m Mapping
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
	m.Dev = MakeDev(maj, mnr)
	if m.Inode, err = strconv.ParseUint(fields[4], 10, 64); err != nil {
		return m, fmt.Errorf("%q: inode: %w", line, err)
	}
	// Paths may contain spaces; take everything after the fifth column.
	rest := line
	for range 5 {
		rest = strings.TrimLeft(rest, " \t")
		rest = rest[strings.IndexAny(rest+" ", " \t"):]
	}
	m.Path = strings.TrimSpace(rest)
	return m, nil
}

// MakeDev encodes a device number the way glibc's makedev does, matching stat's st_dev.
func MakeDev(major, minor uint64) uint64 {
	return (major&0xfffff000)<<32 | (major&0xfff)<<8 | (minor&0xffffff00)<<12 | minor&0xff
}

// Mount is a line of a mount table (/proc/PID/mountinfo).
type Mount struct {
	Root   string // the directory of the file system mounted there ("/" but for bind mounts and namespaces)
	Dir    string // where it is mounted
	FSType string
}

// Mounts reads a mount table.
func Mounts(mountinfo string) ([]Mount, error) {
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil, err
	}
	return ParseMounts(string(b)), nil
}

// ParseMounts parses a mount table's lines, leaving out those that do not parse.
func ParseMounts(table string) []Mount {
	var out []Mount
	for line := range strings.Lines(table) {
		// id parent major:minor root mountpoint options... - fstype source superoptions
		pre, post, ok := strings.Cut(line, " - ")
		fields, fs := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(fs) < 1 {
			continue
		}
		out = append(out, Mount{Root: unescapeMount(fields[3]), Dir: unescapeMount(fields[4]), FSType: fs[0]})
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes of spaces, tabs, newlines and backslashes.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// StatmResident is the resident set size, in bytes, that a statm file's contents give.
func StatmResident(statm []byte) int64 {
	fields := strings.Fields(string(statm))
	if len(fields) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(fields[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// Descendants returns pids and every process descending from one of them now, by the
// parents /proc/PID/stat names: a process manager's workers (php-fpm's, Puma's), and
// theirs. At most max are returned; what exits meanwhile is still listed.
func Descendants(proc string, pids []uint32, max int) []uint32 {
	entries, err := os.ReadDir(proc)
	if err != nil {
		return pids
	}
	children := map[uint32][]uint32{}
	for _, e := range entries {
		pid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(proc, e.Name(), "stat"))
		if err != nil {
			continue
		}
		if ppid, ok := StatParent(b); ok {
			children[ppid] = append(children[ppid], uint32(pid))
		}
	}
	out := slices.Clone(pids)
	seen := map[uint32]bool{}
	for _, p := range pids {
		seen[p] = true
	}
	for i := 0; i < len(out) && len(out) < max; i++ {
		for _, c := range children[out[i]] {
			if !seen[c] && len(out) < max {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	return out
}

// StatParent reads the parent's PID from /proc/PID/stat: the fourth field, after the
// command name in parentheses, which may itself hold spaces and parentheses.
func StatParent(stat []byte) (uint32, bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.ParseUint(f[1], 10, 32)
	return uint32(ppid), err == nil
}
