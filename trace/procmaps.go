package trace

import (
	"io"
	"os"
	"strings"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/procfs"
	"github.com/sonde-profiler/sonde/tracectx"
	"golang.org/x/sys/unix"
)

// mapsLine is one line of /proc/PID/maps.
type mapsLine = procfs.Mapping

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
	err := procfs.ScanMaps(r, func(m procfs.Mapping) bool {
		if strings.Contains(m.Perms, "x") && len(out) < maxExecMappings {
			out = append(out, m)
		}
		if ctxAddr == 0 && strings.HasPrefix(m.Perms, "r") && tracectx.IsContextMapping(m.Path) {
			ctxAddr = m.Start
		}
		return true
	})
	if err != nil {
		return nil, 0, err
	}
	return out, ctxAddr, nil
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
