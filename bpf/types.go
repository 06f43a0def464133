package bpf

import (
	"log/slog"
	"unsafe"
)

// Types shared with the kernel program, as bpf2go generated them from types.h.
type (
	// UnwindRow is one row of an unwind table as the kernel unwinder reads it.
	UnwindRow = samplerUnwindRow
	// ExecMapping is an executable mapping of a process and the table of its file.
	ExecMapping = samplerExecMapping
)

// Sizes the kernel program fixes.
const (
	// MaxUserDepth and MaxKernelDepth are the deepest stacks the kernel records per sample.
	MaxUserDepth   = 128 // MAX_USER_DEPTH in types.h
	MaxKernelDepth = len(samplerSampleEvent{}.Frames) - MaxUserDepth
	// MaxProcessMappings is how many executable mappings of a process the unwinder knows.
	MaxProcessMappings = len(samplerProcInfo{}.Maps)
	// MaxSampleBytes is the largest record a sample takes in the ring buffer.
	MaxSampleBytes = int(unsafe.Sizeof(samplerSampleEvent{}))
)

// The rules of an UnwindRow, named as package unwind names them; CFARuleCount and
// FPRuleCount are the enums' _MAX sentinels, so a test can hold the two packages together.
const (
	CFAInvalid    = uint8(samplerCfaRuleCFA_INVALID)
	CFASP         = uint8(samplerCfaRuleCFA_SP)
	CFAFP         = uint8(samplerCfaRuleCFA_FP)
	CFAPLT        = uint8(samplerCfaRuleCFA_PLT)
	CFASignal     = uint8(samplerCfaRuleCFA_SIGNAL)
	CFAEndOfStack = uint8(samplerCfaRuleCFA_END_OF_STACK)
	CFARuleCount  = int(samplerCfaRuleCFA_RULE_MAX)

	FPUnchanged = uint8(samplerFpRuleFP_UNCHANGED)
	FPAtCFA     = uint8(samplerFpRuleFP_AT_CFA)
	FPInvalid   = uint8(samplerFpRuleFP_INVALID)
	FPRuleCount = int(samplerFpRuleFP_RULE_MAX)
)

// UnwindEnd says how the walk of a user stack ended.
type UnwindEnd uint32

const (
	UnwindComplete  = UnwindEnd(samplerUnwindEndUNWIND_COMPLETE)
	UnwindTruncated = UnwindEnd(samplerUnwindEndUNWIND_TRUNCATED)
	UnwindNoTable   = UnwindEnd(samplerUnwindEndUNWIND_NO_TABLE)
	UnwindBadRead   = UnwindEnd(samplerUnwindEndUNWIND_BAD_READ)
	UnwindInvalid   = UnwindEnd(samplerUnwindEndUNWIND_INVALID)
	UnwindNoUser    = UnwindEnd(samplerUnwindEndUNWIND_NO_USER)
	// UnwindEndCount is how many ways a walk can end (UNWIND_END_MAX).
	UnwindEndCount = int(samplerUnwindEndUNWIND_END_MAX)
)

func (u UnwindEnd) String() string {
	switch u {
	case UnwindComplete:
		return "complete"
	case UnwindTruncated:
		return "truncated"
	case UnwindNoTable:
		return "no_table"
	case UnwindBadRead:
		return "bad_read"
	case UnwindInvalid:
		return "invalid"
	case UnwindNoUser:
		return "no_user_stack"
	default:
		return "unknown"
	}
}

// headerSize is where a sample record's frames begin.
var headerSize = int(unsafe.Offsetof(samplerSampleEvent{}.Frames))

// LogValue lists the counters under the names the summary and the tests use.
func (c Counters) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.Uint64("samples", c.Samples), slog.Uint64("ring_buffer_full", c.RingBufferFull),
		slog.Uint64("user_stack_errors", c.UserStackErrors), slog.Uint64("kernel_stack_errors", c.KernelStackErrors),
		slog.Uint64("process_events", c.ProcessEvents), slog.Uint64("stale_mappings", c.StaleMappings),
	}
	for end, n := range c.UnwindEnds {
		if n > 0 {
			attrs = append(attrs, slog.Uint64("unwind_"+UnwindEnd(end).String(), n))
		}
	}
	for end, n := range c.PythonEnds {
		if n > 0 {
			attrs = append(attrs, slog.Uint64("python_"+PythonEnd(end).String(), n))
		}
	}
	return slog.GroupValue(attrs...)
}
