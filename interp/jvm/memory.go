package jvm

import (
	"encoding/binary"

	"github.com/sonde-profiler/sonde/internal/procmem"
)

// Memory reads a process's memory; ProcessMemory reads a live one's.
type (
	Memory        = procmem.Reader
	ProcessMemory = procmem.Process
)

func readU64(m Memory, addr uint64) (uint64, error) { return procmem.ReadU64(m, addr) }

func readU32(m Memory, addr uint64) (uint32, error) {
	var b [4]byte
	if err := m.ReadAt(b[:], addr); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// maxCString bounds a C string read from the process: HotSpot's names of types, fields
// and code blobs are short; anything longer is not one of them.
const maxCString = 256

// readCString reads a NUL-terminated string of at most limit bytes. It reads in pieces
// that do not cross a page, so that a short string at the end of a mapping is read whole.
func readCString(m Memory, addr uint64, limit int) (string, error) {
	const page = 4096
	var out []byte
	for len(out) < limit {
		n := min(page-int(addr%page), limit-len(out), 64)
		buf := make([]byte, n)
		if err := m.ReadAt(buf, addr); err != nil {
			return "", err
		}
		for i, c := range buf {
			if c == 0 {
				return string(append(out, buf[:i]...)), nil
			}
		}
		out = append(out, buf...)
		addr += uint64(n)
	}
	return "", errStringTooLong
}
