package unwind

// Regs are the registers the unwinder tracks from frame to frame.
type Regs struct {
	PC, SP, FP uint64
}

// StepResult says how a step ended.
type StepResult uint8

const (
	// StepOK: Regs now describe the caller.
	StepOK StepResult = iota
	// StepEnd: the frame is the outermost one; the walk is complete.
	StepEnd
	// StepBadRead: the rule named stack memory that could not be read.
	StepBadRead
	// StepInvalid: no rule covers the PC, or the rule is one the unwinder cannot follow.
	StepInvalid
)

func (r StepResult) String() string {
	switch r {
	case StepOK:
		return "ok"
	case StepEnd:
		return "end"
	case StepBadRead:
		return "bad read"
	case StepInvalid:
		return "invalid"
	}
	return "unknown"
}

// Step unwinds one frame with row, the rule governing regs.PC, exactly as the kernel
// unwinder does on x86-64. read returns the 8-byte word at an address, or false if the
// address cannot be read.
//
// A frame pointer that the row cannot recover (FPInvalid) comes back as 0, because a stale
// value would send a later CFAFP row to a wrong but readable address; with 0, that row's
// read of the return address fails instead.
//
// After a CFASignal step PC is the interrupted instruction rather than a return address,
// so the caller must look it up as is, not as PC-1.
func Step(row Row, regs Regs, read func(addr uint64) (uint64, bool)) (Regs, StepResult) {
	var cfa uint64
	switch row.CFA {
	case CFASP:
		cfa = regs.SP + uint64(int64(row.CFAOffset))
	case CFAFP:
		cfa = regs.FP + uint64(int64(row.CFAOffset))
	case CFAPLT:
		// A lazy PLT entry is jmpq *GOT (offsets 0-5), pushq $index (6-10), jmpq PLT0
		// (11-15): the pushed word is on the stack only from offset 11.
		cfa = regs.SP + 8
		if regs.PC&15 >= 11 {
			cfa += 8
		}
	case CFASignal:
		pc, ok1 := read(regs.SP + signalPCOffset)
		sp, ok2 := read(regs.SP + signalSPOffset)
		fp, ok3 := read(regs.SP + signalFPOffset)
		if !ok1 || !ok2 || !ok3 {
			return regs, StepBadRead
		}
		return Regs{PC: pc, SP: sp, FP: fp}, StepOK
	case CFAEndOfStack:
		return regs, StepEnd
	default:
		return regs, StepInvalid
	}

	pc, ok := read(cfa - 8)
	if !ok {
		return regs, StepBadRead
	}
	next := Regs{PC: pc, SP: cfa, FP: regs.FP}
	switch row.FP {
	case FPAtCFA:
		fp, ok := read(cfa + uint64(int64(row.FPOffset)))
		if !ok {
			return regs, StepBadRead
		}
		next.FP = fp
	case FPInvalid:
		next.FP = 0
	}
	return next, StepOK
}
