package jvm

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// Mapping is one line of /proc/PID/maps that maps a file.
type Mapping struct {
	Start, End, Offset uint64
	Key                objfile.Key
	Path               string
}

// maxMapsSize bounds the maps file read: a process with a million mappings is not one
// whose libjvm is worth finding this way.
const maxMapsSize = 64 << 20

// FindLibJVM finds the mapping of libjvm.so at file offset 0 (where the load bias is
// computed from) among a process's maps.
func FindLibJVM(maps []byte) (Mapping, bool) {
	if len(maps) > maxMapsSize {
		maps = maps[:maxMapsSize]
	}
	sc := bufio.NewScanner(bytes.NewReader(maps))
	sc.Buffer(make([]byte, 0, 4096), 20<<10)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || !IsLibJVM(f[len(f)-1]) {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		var m Mapping
		var err [5]error
		m.Start, err[0] = strconv.ParseUint(lo, 16, 64)
		m.End, err[1] = strconv.ParseUint(hi, 16, 64)
		m.Offset, err[2] = strconv.ParseUint(f[2], 16, 64)
		major, minor, _ := strings.Cut(f[3], ":")
		maj, e3 := strconv.ParseUint(major, 16, 32)
		mnr, e4 := strconv.ParseUint(minor, 16, 32)
		err[3] = e3
		if e4 != nil {
			err[3] = e4
		}
		m.Key.Dev = (maj&0xfffff000)<<32 | (maj&0xfff)<<8 | (mnr&0xffffff00)<<12 | mnr&0xff
		m.Key.Inode, err[4] = strconv.ParseUint(f[4], 10, 64)
		if err != [5]error{} || m.End <= m.Start {
			continue
		}
		m.Path = strings.Join(f[5:], " ")
		return m, true
	}
	return Mapping{}, false
}

// Attach reads a live process's HotSpot: its libjvm.so from its maps, the serviceability
// tables from its memory, and their layout. A process that maps no libjvm.so fails with
// ErrNotHotSpot.
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
