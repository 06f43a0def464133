package trace

import (
	"fmt"
	"os"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// KernelPath names the kernel's mapping, as perf and pprof tools expect.
const KernelPath = "[kernel.kallsyms]"

// KernelMapping describes the running kernel as one mapping covering the kernel half of
// the address space, with its build ID from /sys/kernel/notes when readable.
func KernelMapping(notesPath string) (*Mapping, error) {
	m := &Mapping{
		Start: KernelStart,
		End:   0xffffffffffffffff,
		Path:  KernelPath,
		File:  &objfile.File{Path: KernelPath},
	}
	data, err := os.ReadFile(notesPath)
	if err != nil {
		return m, fmt.Errorf("read kernel build id: %w", err)
	}
	if m.File.GNUBuildID, err = objfile.ParseKernelNotes(data); err != nil {
		return m, fmt.Errorf("read kernel build id from %s: %w", notesPath, err)
	}
	return m, nil
}
