package unwind

import (
	"structs"
)

// End says how a walk of a user stack ended. The values are the kernel's enum unwind_end
// (bpf/types.h); a test holds the two together.
type End uint8

const (
	EndComplete  End = iota // reached the outermost frame
	EndTruncated            // MaxDepth frames and still going
	EndNoTable              // the frame-pointer fallback ended the walk
	EndBadRead              // reading the stack failed
	EndInvalid              // a row the walker cannot follow, or a nonsense address
	EndNoUser               // a kernel thread: no user stack
	// EndCount is how many ways a walk can end: UNWIND_END_MAX.
	EndCount int = iota
)

// MaxDepth is how many user frames the kernel walks at most: MAX_USER_DEPTH.
const MaxDepth = 128

// KernelMapping is an executable mapping as the kernel unwinder stores it: struct
// exec_mapping of bpf/types.h, field for field, so that bpf.ExecMapping converts to it.
type KernelMapping struct {
	_         structs.HostLayout
	Start     uint64
	End       uint64
	Bias      uint64 // runtime address - ELF virtual address
	TableId   uint32 // the file's table, as the kernel numbers tables
	RowsCount uint32 // 0: no table, walk by frame pointer
}

// Walk is the Go model of the kernel's stack walker (bpf/unwinder.h), step for step: from
// the leaf's registers, through the process's mappings (sorted by Start) and their files'
// tables, it returns the frames, leaf first, and how the walk ended. table returns the
// rows of a table id, nil for none; read returns the 8-byte word at an address.
func Walk(regs Regs, mappings []KernelMapping, table func(id uint32) []KernelRow, read func(addr uint64) (uint64, bool)) ([]uint64, End) {
	var frames []uint64
	exact := true // regs.PC is an interrupted instruction, not a return address
	usedFP := false
	end, done := EndTruncated, false
	for range MaxDepth + 1 {
		end, done = walkStep(&regs, &exact, &usedFP, &frames, mappings, table, read)
		if done {
			break
		}
	}
	if !done {
		end = EndTruncated
	} else if end == EndComplete && usedFP {
		end = EndNoTable
	}
	return frames, end
}

// framePointerRow is what a walk without a table assumes: the caller's frame pointer at
// the frame pointer, the return address above it.
var framePointerRow = Row{CFA: CFAFP, CFAOffset: 16, FP: FPAtCFA, FPOffset: -16}

func walkStep(regs *Regs, exact, usedFP *bool, frames *[]uint64, mappings []KernelMapping, table func(uint32) []KernelRow, read func(uint64) (uint64, bool)) (End, bool) {
	if regs.PC == 0 {
		return EndComplete, true
	}
	if len(*frames) >= MaxDepth {
		return EndTruncated, true
	}
	*frames = append(*frames, regs.PC)

	var row *Row
	if m := findMapping(mappings, regs.PC); m != nil && m.RowsCount > 0 {
		rows := table(m.TableId)
		if rows == nil {
			return EndInvalid, true
		}
		back := uint64(1)
		if *exact {
			back = 0
		}
		r, ok := findRow(rows[:min(int(m.RowsCount), len(rows))], uint32(regs.PC-m.Bias-back))
		if !ok {
			return EndInvalid, true
		}
		row = &r
	}

	if row == nil {
		*usedFP = true
		if regs.FP == 0 {
			return EndNoTable, true
		}
		next, res := Step(framePointerRow, *regs, read)
		if res != StepOK {
			return EndNoTable, true
		}
		return advance(regs, exact, next, len(*frames))
	}
	next, res := Step(*row, *regs, read)
	switch res {
	case StepEnd:
		return EndComplete, true
	case StepBadRead:
		return EndBadRead, true
	case StepInvalid:
		return EndInvalid, true
	}
	if row.CFA == CFASignal {
		// The interrupted frame's PC is exact, and its stack may lie anywhere.
		*regs, *exact = next, true
		return 0, false
	}
	return advance(regs, exact, next, len(*frames))
}

// advance moves to the caller unless its frame does not lie above the callee's.
func advance(regs *Regs, exact *bool, next Regs, n int) (End, bool) {
	if next.SP <= regs.SP && n > 1 {
		return EndInvalid, true
	}
	*regs, *exact = next, false
	return 0, false
}

// findMapping is the kernel's binary search over a process's mappings.
func findMapping(ms []KernelMapping, pc uint64) *KernelMapping {
	lo, hi := 0, len(ms)
	for lo < hi {
		mid := lo + (hi-lo)/2
		if ms[mid].Start <= pc {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return nil
	}
	m := &ms[lo-1]
	if pc >= m.End || pc < m.Start {
		return nil
	}
	return m
}

// findRow is the kernel's search for the last row at or below vaddr; unlike Table.Lookup
// it returns rows whose rule is CFAInvalid, which Step then refuses.
func findRow(rows []KernelRow, vaddr uint32) (Row, bool) {
	lo, hi := 0, len(rows)
	for lo < hi {
		mid := lo + (hi-lo)/2
		if rows[mid].Pc <= vaddr {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return Row{}, false
	}
	return rows[lo-1].Row(), true
}
