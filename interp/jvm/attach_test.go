package jvm

import (
	"bytes"
	"fmt"
	"os"
	"strconv"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/procfs"
)

// Mapping is one line of /proc/PID/maps that maps a file.
type Mapping struct {
	Start, End, Offset uint64
	Key                objfile.Key
	Path               string
}

// FindLibJVM finds the mapping of libjvm.so at file offset 0 (where the load bias is
// computed from) among a process's maps.
func FindLibJVM(maps []byte) (Mapping, bool) {
	var found Mapping
	var ok bool
	procfs.ScanMaps(bytes.NewReader(maps), func(m procfs.Mapping) bool {
		if m.Inode == 0 || !IsLibJVM(m.Path) {
			return true
		}
		found, ok = Mapping{Start: m.Start, End: m.End, Offset: m.Offset, Key: objfile.Key{Dev: m.Dev, Inode: m.Inode}, Path: m.Path}, true
		return false
	})
	return found, ok
}

// Attach reads a live process's HotSpot, as the tests do without the agent: its
// libjvm.so from its maps, the serviceability tables from its memory, and their layout. A
// process that maps no libjvm.so fails with ErrNotHotSpot.
func Attach(pid uint32) (*Process, error) {
	dir := "/proc/" + strconv.FormatUint(uint64(pid), 10)
	maps, err := os.ReadFile(dir + "/maps")
	if err != nil {
		return nil, err
	}
	m, ok := FindLibJVM(maps)
	if !ok {
		return nil, ErrNotHotSpot
	}
	f := objfile.NewFile(m.Key, m.Path, objfile.Source{ProcDir: dir, Start: m.Start, End: m.End, Path: m.Path})
	lib, err := InspectFile(f)
	if err != nil {
		return nil, fmt.Errorf("inspect %s: %w", m.Path, err)
	}
	bias, ok := lib.Bias(m.Start, m.Offset)
	if !ok {
		return nil, fmt.Errorf("%s mapped at %#x from offset %#x: no segment there", m.Path, m.Start, m.Offset)
	}
	return NewProcess(ProcessMemory(pid), lib, bias)
}
