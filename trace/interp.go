package trace

// How the kernel writes a language runtime's frame among a sample's user frames (bpf/types.h,
// enum interp_frame_encoding; bpf's tests hold the two together): bits 63-62 hold 01, which
// no canonical user or kernel address has, bits 61-58 the runtime's number, and the other 58
// bits are the runtime's own, which only its package decodes.
const (
	interpTagShift     = 62
	interpTag          = 1
	interpRuntimeShift = 58
	// InterpRuntimeMax is the highest runtime number a frame can carry.
	InterpRuntimeMax = 15
	// InterpPayloadBits is how many bits of a frame are the runtime's.
	InterpPayloadBits = 58
)

// DecodeInterpFrame splits a user frame the kernel wrote for a runtime's code into the
// runtime's number and its payload; ok is false for a native address.
func DecodeInterpFrame(v uint64) (runtime uint8, payload uint64, ok bool) {
	if v>>interpTagShift != interpTag {
		return 0, 0, false
	}
	return uint8(v >> interpRuntimeShift & InterpRuntimeMax), v & (1<<InterpPayloadBits - 1), true
}

// EncodeInterpFrame is DecodeInterpFrame's inverse, as the kernel encodes, for runtimes'
// packages and for tests and tools that make samples.
func EncodeInterpFrame(runtime uint8, payload uint64) uint64 {
	return interpTag<<interpTagShift | uint64(runtime&InterpRuntimeMax)<<interpRuntimeShift | payload&(1<<InterpPayloadBits-1)
}

// Runtime is a language runtime as the aggregator meets its frames: the kernel walker of
// the runtime writes them among the native ones (package interp/<runtime> describes one).
type Runtime interface {
	// FrameType names its frames: the value OpenTelemetry's semantic conventions give
	// profile.frame.type for the runtime, which the reporters show as the frame's kind.
	FrameType() string
	// DecodeFrame splits the payload of one of its frames into the code's identity (an
	// address in the process, say) and the position in that code.
	DecodeFrame(payload uint64) (code uint64, offset uint32)
	// SeenCode hears of the code of its frames as stacks holding them are first seen in an
	// interval, so that it can read the code while the process lives. It is called from the
	// goroutine adding samples and must not block.
	SeenCode(pid uint32, image uint64, code uint64)
}

// Runtimes are the language runtimes whose frames samples may hold, by their number.
type Runtimes map[uint8]Runtime

// MappingObservers tells several observers, in order.
type MappingObservers []MappingObserver

func (o MappingObservers) ProcessMappings(pid uint32, execID uint64, mappings []*Mapping) {
	for _, x := range o {
		x.ProcessMappings(pid, execID, mappings)
	}
}

func (o MappingObservers) ProcessGone(pid uint32) {
	for _, x := range o {
		x.ProcessGone(pid)
	}
}
