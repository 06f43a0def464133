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
	// GoRuntime is where a Go binary's runtime keeps what following its stack switches reads.
	GoRuntime = samplerGoRuntime
)

// Sizes the kernel program fixes.
const (
	// MaxUserDepth and MaxKernelDepth are the deepest stacks the kernel records per sample.
	MaxUserDepth   = 256 // MAX_USER_DEPTH in types.h
	MaxKernelDepth = len(samplerSampleEvent{}.Frames) - MaxUserDepth
	// MaxProcessMappings is how many executable mappings of a process the unwinder knows.
	MaxProcessMappings = len(samplerProcInfo{}.Maps)
	// MaxSampleBytes is the largest record a sample takes in the ring buffer.
	MaxSampleBytes = int(unsafe.Sizeof(samplerSampleEvent{}))
)

// The rules of an UnwindRow, named as package unwind names them; CFARuleCount,
// FPRuleCount and GoFuncCount are the enums' _MAX sentinels, so a test can hold the two
// packages together.
const (
	CFAInvalid      = uint8(samplerCfaRuleCFA_INVALID)
	CFASP           = uint8(samplerCfaRuleCFA_SP)
	CFAFP           = uint8(samplerCfaRuleCFA_FP)
	CFAPLT          = uint8(samplerCfaRuleCFA_PLT)
	CFASignal       = uint8(samplerCfaRuleCFA_SIGNAL)
	CFAEndOfStack   = uint8(samplerCfaRuleCFA_END_OF_STACK)
	CFAReg          = uint8(samplerCfaRuleCFA_REG)
	CFADeref        = uint8(samplerCfaRuleCFA_DEREF)
	CFAFramePointer = uint8(samplerCfaRuleCFA_FRAME_POINTER)
	CFAGo           = uint8(samplerCfaRuleCFA_GO)
	CFAExpression   = uint8(samplerCfaRuleCFA_EXPRESSION)
	CFARAElsewhere  = uint8(samplerCfaRuleCFA_RA_ELSEWHERE)
	CFARuleCount    = int(samplerCfaRuleCFA_RULE_MAX)

	FPUnchanged = uint8(samplerFpRuleFP_UNCHANGED)
	FPAtCFA     = uint8(samplerFpRuleFP_AT_CFA)
	FPInvalid   = uint8(samplerFpRuleFP_INVALID)
	FPAtFP      = uint8(samplerFpRuleFP_AT_FP)
	FPAtSP      = uint8(samplerFpRuleFP_AT_SP)
	FPRuleCount = int(samplerFpRuleFP_RULE_MAX)

	GoFuncTop         = uint8(samplerGoFuncGO_FUNC_TOP)
	GoFuncSystemstack = uint8(samplerGoFuncGO_FUNC_SYSTEMSTACK)
	GoFuncMorestack   = uint8(samplerGoFuncGO_FUNC_MORESTACK)
	GoFuncAsmcgocall  = uint8(samplerGoFuncGO_FUNC_ASMCGOCALL)
	GoFuncFPSwitch    = uint8(samplerGoFuncGO_FUNC_FP_SWITCH)
	GoFuncCount       = int(samplerGoFuncGO_FUNC_MAX)
)

// UnwindEnd says how the walk of a user stack ended.
type UnwindEnd uint32

const (
	UnwindComplete      = UnwindEnd(samplerUnwindEndUNWIND_COMPLETE)
	UnwindCompleteFP    = UnwindEnd(samplerUnwindEndUNWIND_COMPLETE_FP)
	UnwindTruncated     = UnwindEnd(samplerUnwindEndUNWIND_TRUNCATED)
	UnwindNoUser        = UnwindEnd(samplerUnwindEndUNWIND_NO_USER)
	UnwindFPBroken      = UnwindEnd(samplerUnwindEndUNWIND_FP_BROKEN)
	UnwindBadRead       = UnwindEnd(samplerUnwindEndUNWIND_BAD_READ)
	UnwindNoRow         = UnwindEnd(samplerUnwindEndUNWIND_NO_ROW)
	UnwindCFAExpression = UnwindEnd(samplerUnwindEndUNWIND_CFA_EXPRESSION)
	UnwindRegister      = UnwindEnd(samplerUnwindEndUNWIND_REGISTER)
	UnwindRARule        = UnwindEnd(samplerUnwindEndUNWIND_RA_RULE)
	UnwindNotAbove      = UnwindEnd(samplerUnwindEndUNWIND_NOT_ABOVE)
	UnwindTableGone     = UnwindEnd(samplerUnwindEndUNWIND_TABLE_GONE)
	UnwindGoSwitch      = UnwindEnd(samplerUnwindEndUNWIND_GO_SWITCH)
	UnwindInvalid       = UnwindEnd(samplerUnwindEndUNWIND_INVALID)
	// UnwindEndCount is how many ways a walk can end (UNWIND_END_MAX).
	UnwindEndCount = int(samplerUnwindEndUNWIND_END_MAX)
)

// unwindEndNames are the names the summary and the tests use, by UnwindEnd.
var unwindEndNames = [UnwindEndCount]string{
	UnwindComplete:      "complete",
	UnwindCompleteFP:    "complete_fp",
	UnwindTruncated:     "truncated",
	UnwindNoUser:        "no_user_stack",
	UnwindFPBroken:      "fp_broken",
	UnwindBadRead:       "bad_read",
	UnwindNoRow:         "no_row",
	UnwindCFAExpression: "cfa_expression",
	UnwindRegister:      "register",
	UnwindRARule:        "ra_rule",
	UnwindNotAbove:      "not_above",
	UnwindTableGone:     "table_gone",
	UnwindGoSwitch:      "go_switch",
	UnwindInvalid:       "invalid",
}

func (u UnwindEnd) String() string {
	if int(u) < len(unwindEndNames) && unwindEndNames[u] != "" {
		return unwindEndNames[u]
	}
	return "unknown"
}

// Failed reports whether the walk stopped short of the outermost frame for a reason other
// than the depth limit: what the counters of failures count.
func (u UnwindEnd) Failed() bool {
	switch u {
	case UnwindComplete, UnwindCompleteFP, UnwindTruncated, UnwindNoUser:
		return false
	}
	return true
}

// headerSize is where a sample record's frames begin.
var headerSize = int(unsafe.Offsetof(samplerSampleEvent{}.Frames))

// Outcomes sums the walks by outcome: complete (by tables alone, or with frame pointers
// for code without a table), truncated at the depth limit, and failed for any reason.
func (c Counters) Outcomes() (complete, completeFP, truncated, failed uint64) {
	for end, n := range c.UnwindEnds {
		switch e := UnwindEnd(end); {
		case e == UnwindComplete:
			complete += n
		case e == UnwindCompleteFP:
			completeFP += n
		case e == UnwindTruncated:
			truncated += n
		case e.Failed():
			failed += n
		}
	}
	return complete, completeFP, truncated, failed
}

// LogValue lists the counters under the names the summary and the tests use: the outcome
// of every walk, each kind of failure on its own, and what was lost.
func (c Counters) LogValue() slog.Value {
	complete, completeFP, truncated, failed := c.Outcomes()
	attrs := []slog.Attr{
		slog.Uint64("samples", c.Samples), slog.Uint64("ring_buffer_full", c.RingBufferFull),
		slog.Uint64("user_stack_errors", c.UserStackErrors), slog.Uint64("kernel_stack_errors", c.KernelStackErrors),
		slog.Uint64("process_events", c.ProcessEvents), slog.Uint64("stale_mappings", c.StaleMappings),
		slog.Uint64("unwind_complete", complete), slog.Uint64("unwind_complete_fp", completeFP),
		slog.Uint64("unwind_truncated", truncated), slog.Uint64("unwind_failed", failed),
	}
	for end, n := range c.UnwindEnds {
		if e := UnwindEnd(end); n > 0 && (e.Failed() || e == UnwindNoUser) {
			attrs = append(attrs, slog.Uint64("unwind_"+e.String(), n))
		}
	}
	if c.OffCPU != (OffCPUCounters{}) {
		o := c.OffCPU
		group := []any{"switches", o.Switches, "walked", o.Walked, "samples", o.Samples, "short", o.Short, "lost", o.Lost, "stale", o.Stale}
		if o.GoParks > 0 {
			group = append(group, "goroutine_parks", o.GoParks, "goroutine_walks", o.GoWalked, "goroutine_samples", o.GoSamples)
		}
		attrs = append(attrs, slog.Group("off_cpu", group...))
	}
	if c.Context != (ContextCounters{}) {
		attrs = append(attrs, slog.Any("context", c.Context))
	}
	return slog.GroupValue(attrs...)
}
