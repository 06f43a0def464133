package trace

// How the kernel writes a CPython frame among a sample's user frames (bpf/types.h, enum
// py_frame_encoding; bpf's tests hold the two together): bits 63-62 hold 01, which no
// canonical user or kernel address has, then the code object's address >> 4 in 43 bits,
// then the instruction's offset in 2-byte code units in 19 bits.
const (
	pythonTagShift   = 62
	pythonTag        = 1
	pythonAlignShift = 4
	pythonOffsetBits = 19
	pythonCodeBits   = 43
)

// PythonFrame decodes a user frame the kernel wrote for a CPython frame: the code object's
// address and the instruction's offset in bytes. ok is false for a native address.
func PythonFrame(v uint64) (code uint64, offset uint32, ok bool) {
	if v>>pythonTagShift != pythonTag {
		return 0, 0, false
	}
	code = (v >> pythonOffsetBits & (1<<pythonCodeBits - 1)) << pythonAlignShift
	offset = uint32(v&(1<<pythonOffsetBits-1)) * 2
	return code, offset, true
}

// EncodePythonFrame is PythonFrame's inverse, as the kernel encodes, for tests and tools
// that make samples.
func EncodePythonFrame(code uint64, offset uint32) uint64 {
	units := min(uint64(offset/2), 1<<pythonOffsetBits-1)
	return pythonTag<<pythonTagShift | (code>>pythonAlignShift&(1<<pythonCodeBits-1))<<pythonOffsetBits | units
}

// InterpObserver hears of the code objects of interpreted frames as stacks holding them
// are first seen in an interval, so that it can read them while the process lives. It is
// called from the goroutine adding samples and must not block.
type InterpObserver interface {
	SeenCode(pid uint32, image uint64, code uint64)
}

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
