package trace

import (
	"time"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// FrameKind says what kind of code a frame runs; the names are OpenTelemetry's
// profile.frame.type values.
type FrameKind uint8

const (
	FrameNative FrameKind = iota + 1
	FrameKernel
	FrameGo
	// FrameInterp is a frame of a language runtime's own code, interpreted or compiled by
	// its JIT: Location.Interp says which runtime and which code.
	FrameInterp
)

func (k FrameKind) String() string {
	switch k {
	case FrameNative:
		return "native"
	case FrameKernel:
		return "kernel"
	case FrameGo:
		return "go"
	case FrameInterp:
		return "interpreted"
	default:
		return "unknown"
	}
}

// Mapping is an executable region of an address space.
type Mapping struct {
	Start, End uint64        // [Start, End)
	Offset     uint64        // file offset of Start
	Path       string        // as /proc/PID/maps names it, e.g. "/usr/lib/libc.so.6", "[vdso]"
	File       *objfile.File // nil for anonymous and pseudo mappings
}

// Process describes a sampled thread group.
type Process struct {
	PID         uint32
	Name        string // the main thread's comm
	ExePath     string
	ContainerID string // from the cgroup path; empty outside containers
	PodUID      string // the Kubernetes pod's UID, from the cgroup path
	Cgroup      string // the cgroup v2 path (or the best v1 one) as the process sees it
	// EnvServiceName is the service name the process's environment gives the
	// OpenTelemetry SDK: OTEL_SERVICE_NAME, else service.name in OTEL_RESOURCE_ATTRIBUTES.
	EnvServiceName string
	// Published are the resource attributes the process published itself, in its
	// OpenTelemetry process context (OTEP 4719): service.name, service.version…
	Published map[string]string
	// Attributes are resource attributes a Describer added (service.name, k8s.*). A
	// Process is not changed once published; a new description is a new Process.
	Attributes map[string]string
}

// Line is one source-level frame at an address; inlined code yields several, innermost first.
type Line struct {
	Function   string // readable name
	SystemName string // name as the object file stores it (mangled)
	File       string
	Line       int64
}

// Location is a distinct code address in a profile, shared by every sample that passes it.
type Location struct {
	Kind    FrameKind
	Address uint64   // runtime address in its address space
	Mapping *Mapping // nil when no mapping covers Address
	Lines   []Line   // filled by symbolization
	// Interp identifies the code of a runtime's frame (FrameInterp), whose Address is its
	// code's identity; nil for native, Go and kernel frames.
	Interp *InterpFrame
	// NameSource says where symbolization found the name: "symtab", "dynsym",
	// "dwarf", "gopclntab", "kallsyms", "plt" (a PLT entry, name@plt), "fde" (code of a
	// stripped object, object+0xSTART after its FDE), or "none" when nothing named the
	// location; empty when it was not symbolized.
	NameSource string

	// A location outlives its interval: it belongs to the cached chunks that hold it and
	// is reported, and named, again each interval one of them is sampled. refs counts
	// those chunks; listed is the last flush whose Profile lists the location.
	refs   int32
	listed uint64
}

// InterpFrame is the code a runtime's frame runs: code of an image (one exec of a process)
// and a position in it, both as the runtime's package decoded them from the frame.
type InterpFrame struct {
	// Type is the runtime's name for its frames, its OpenTelemetry profile.frame.type
	// value.
	Type string
	// Runtime is the runtime's number in the kernel's frames; 0 for a frame read back
	// from a profile.
	Runtime uint8
	PID     uint32
	Image   uint64 // numbers the image within this run; a new exec of PID is another
	Code    uint64 // the code's identity in the process, e.g. a code object's address
	// Offset is the position in the code, in the runtime's own unit.
	Offset uint32
	raw    uint64 // the frame as the kernel wrote it
}

// KindName names the location's kind of code for people and for OpenTelemetry's
// profile.frame.type: "native", "kernel", "go", or a runtime's own name for its frames.
func (l *Location) KindName() string {
	if l.Kind == FrameInterp && l.Interp != nil && l.Interp.Type != "" {
		return l.Interp.Type
	}
	return l.Kind.String()
}

// FileOffset is the location's offset in its mapped file, the address symbolization needs.
func (l *Location) FileOffset() (uint64, bool) {
	if l.Mapping == nil || l.Mapping.File == nil {
		return 0, false
	}
	return l.Address - l.Mapping.Start + l.Mapping.Offset, true
}

// Sample is a count of identical stacks from one thread.
type Sample struct {
	Process    *Process
	TID        uint32
	ThreadName string
	Locations  []*Location // leaf first: kernel frames, then user frames
	// Chunks is Locations cut into the collector's interned chunks, leaf chunk first. A
	// chunk's slice is shared by every sample in the profile that contains the chunk, so
	// consumers can do per-chunk work once (see reporter/otlp). Empty for hand-built samples.
	Chunks [][]*Location
	// Count is how many CPU samples took the stack, each standing for the profile's Period.
	Count int64
	// OffCPU is how long, in nanoseconds, the thread waited off the CPU with this stack
	// (off-CPU profiling); 0 in a CPU-only profile.
	OffCPU int64
	// Timestamps of each sample, when the collector keeps them.
	Timestamps []time.Time
	// Link is the span the samples were taken in, from their thread's trace context;
	// zero when none. Samples that differ only in their link are counted apart.
	Link Link
	// Attributes are the trace context's other attributes: a thread context record's,
	// named by its process's key map, or a goroutine's labels; sorted by key.
	Attributes []Attribute
}

// Profile is what was sampled in [Start, End).
type Profile struct {
	Start, End time.Time
	// Period is the CPU time one sample stands for (1/frequency).
	Period    time.Duration
	Samples   []*Sample
	Locations []*Location // every location the samples use, once each
}

// HasOffCPU tells whether any sample waited off the CPU.
func (p *Profile) HasOffCPU() bool {
	for _, s := range p.Samples {
		if s.OffCPU > 0 {
			return true
		}
	}
	return false
}

// TotalOffCPU is how long the profile's threads waited off the CPU, in all.
func (p *Profile) TotalOffCPU() time.Duration {
	var n int64
	for _, s := range p.Samples {
		n += s.OffCPU
	}
	return time.Duration(n)
}

// View is what a local view of a profile (flame graph, top table, folded stacks) weighs
// its stacks by.
type View uint8

const (
	ViewCPU    View = iota // CPU samples
	ViewOffCPU             // time waited off the CPU
	ViewWall               // both: time on the CPU and off it
)

func (v View) String() string {
	switch v {
	case ViewOffCPU:
		return "off-cpu"
	case ViewWall:
		return "wall"
	}
	return "cpu"
}

// ViewUnit is the time one sample of an off-CPU or wall view stands for.
const ViewUnit = time.Millisecond

// ForView returns the profile as a view weighs it, for outputs that count samples:
// ViewCPU keeps the CPU samples; ViewOffCPU and ViewWall count time, each sample standing
// for ViewUnit (the profile's Period then), a CPU sample for its period, a wait for its
// length, rounded to the nearest unit. A profile without off-CPU samples is its own CPU
// view. The samples are new; their locations are shared.
func (p *Profile) ForView(v View) *Profile {
	if v == ViewCPU && !p.HasOffCPU() {
		return p
	}
	out := *p
	out.Samples = make([]*Sample, 0, len(p.Samples))
	if v != ViewCPU {
		out.Period = ViewUnit
	}
	for _, s := range p.Samples {
		var n int64
		switch v {
		case ViewCPU:
			n = s.Count
		case ViewOffCPU:
			n = (s.OffCPU + int64(ViewUnit)/2) / int64(ViewUnit)
		case ViewWall:
			n = (s.Count*int64(p.Period) + s.OffCPU + int64(ViewUnit)/2) / int64(ViewUnit)
		}
		if n <= 0 {
			continue
		}
		c := *s
		c.Count, c.OffCPU = n, 0
		if v != ViewCPU {
			c.Timestamps = nil
		}
		out.Samples = append(out.Samples, &c)
	}
	return &out
}

// TotalCount is the number of samples in the profile.
func (p *Profile) TotalCount() int64 {
	var n int64
	for _, s := range p.Samples {
		n += s.Count
	}
	return n
}
