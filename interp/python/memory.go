package python

import "github.com/sonde-profiler/sonde/internal/procmem"

// Memory reads a process's memory; ProcessMemory reads a live one's.
type (
	Memory        = procmem.Reader
	ProcessMemory = procmem.Process
)
