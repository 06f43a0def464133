package node

import "github.com/sonde-profiler/sonde/internal/procmem"

// Memory reads a process's memory; ProcessMemory reads a live one's.
type (
	Memory        = procmem.Reader
	ProcessMemory = procmem.Process
)

func readU64(m Memory, addr uint64) (uint64, error) { return procmem.ReadU64(m, addr) }
