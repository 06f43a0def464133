// Package interp is the seam between sonde's pipeline and the language runtimes whose frames
// it walks and names. A runtime is a package below this one (python, node, jvm, php, ruby) that
// declares itself in a Spec: its number and name, its maps in the kernel program, its share
// of --memory-limit, the code its files keep frame pointers in, and a constructor of its
// Runtime. cmd/agent lists the Specs, in one place; nothing else names a runtime.
//
// The package also holds what the runtimes' trackers share (Files, Procs, KernelStats):
// each runtime keeps only what differs.
package interp

import (
	"context"
	"debug/elf"
	"log/slog"

	"github.com/sonde-profiler/sonde/trace"
)

// Runtime is a language runtime on the host as the pipeline drives it. It recognises the
// processes that run it among their mappings and tells the kernel how to walk them (a
// trace.MappingObserver, on the process tracker's goroutine), decodes the frames the
// kernel writes and hears of their code (trace.Runtime), names them (Name, as
// symbolize.InterpNamer), reads what naming needs from the processes until ctx is done
// (Run), and logs what it counted (LogValue).
type Runtime interface {
	trace.MappingObserver
	trace.Runtime
	Name(loc *trace.Location) ([]trace.Line, bool)
	Run(ctx context.Context) error
	slog.LogValuer
}

// Spec is what a runtime declares of itself.
type Spec struct {
	// Name keys its counts in the summary ("python").
	Name string
	// Number is its number in the frames and code regions the kernel writes, 1 to 15
	// (its header's <NAME>_RUNTIME in bpf/).
	Number uint8
	// Maps are its maps in the kernel program (bpf/runtimes.h).
	Maps KernelMaps
	// State is a value of the per-process state its tracker writes to Maps.Procs: a struct
	// laid out as the kernel's, which the writer checks before the runtime starts.
	State any
	// MemoryBytes is its share of --memory-limit for what naming keeps across processes;
	// nil: it keeps nothing that needs a bound of its own.
	MemoryBytes func(limit int64) int
	// FramePointerCode finds code of the runtime in an ELF file that keeps frame pointers
	// but has no call frame information (V8's embedded builtins in node): ranges of ELF
	// virtual addresses, [start, end), walked by frame pointer. nil: none.
	FramePointerCode func(f *elf.File) [][2]uint64
	// Unsupported is what the log says, once per file, of a file that holds the runtime
	// in a version or build sonde cannot walk or name; the file and why follow.
	Unsupported string
	// New makes the runtime.
	New func(env Env) Runtime
}

// KernelMaps names a runtime's own maps in the kernel program.
type KernelMaps struct {
	// Procs is its per-process map, keyed by tgid: a struct that begins with the __u64
	// exec_id it was written for.
	Procs string
	// Counters is its per-CPU array counting how its walks ended, indexed by the values of
	// its enum Ends, whose members name them.
	Counters, Ends string
	// Sizes sizes its other maps.
	Sizes map[string]uint32
}

// Env is what the pipeline gives a runtime.
type Env struct {
	// Kernel writes and reads its maps.
	Kernel Kernel
	// OnError hears once per file why the runtime in it cannot be walked or named.
	OnError func(path string, err error)
	// OnReuse hears that an image's runtime gave a code address to other code: the
	// aggregator's RenewImage, so that a name never changes for a location once given.
	OnReuse func(pid uint32, image uint64)
	// MaxBytes is its share of --memory-limit (Spec.MemoryBytes); 0 where it has none.
	MaxBytes int
	// MaxProcesses bounds the processes the kernel holds state of.
	MaxProcesses int
}

// Kernel writes and reads one runtime's maps in the kernel (bpf.RuntimeKernel behind an
// adapter, or a fake in tests).
type Kernel interface {
	// Set tells the kernel pid runs the runtime, as of its exec execID: state, a pointer to
	// a value of the Spec's State type or a KernelValuer, and the runtime's code regions in the process
	// (whose native frames hand a sample to its walker after the walk; none for a runtime
	// walked within the native walk).
	Set(pid uint32, execID uint64, state any, regions []Region) error
	// Delete forgets what the kernel was told of pid.
	Delete(pid uint32) error
	// Lookup reads the value at key of one of the runtime's maps; false when it has none.
	Lookup(name string, key, value any) (bool, error)
	// Ends counts the kernel's walks of the runtime's frames by how they ended, by the
	// names of the ends.
	Ends() (map[string]uint64, error)
}

// Region is a runtime's code in a process, [Start, End).
type Region struct{ Start, End uint64 }

// KernelValuer is a state a tracker keeps in its own terms, which it gives Kernel.Set as
// is: the writer takes the kernel's value from it, a pointer to the Spec's State type, or
// the error that says why the kernel's walker could not read it.
type KernelValuer interface {
	KernelValue() (any, error)
}
