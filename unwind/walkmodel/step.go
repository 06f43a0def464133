package walkmodel

import "github.com/sonde-profiler/sonde/unwind"

// Regs are the registers the unwinder tracks from frame to frame.
type Regs struct {
	PC, SP, FP uint64
	// Others says where the frame's other general-purpose registers can be read: only the
	// frame the thread was interrupted in knows them.
	Others Others
}

// RegSource says where a frame's general-purpose registers beyond SP and FP are.
type RegSource uint8

const (
	RegsNone     RegSource = iota // unknown: a caller's frame
	RegsLeaf                      // the sampled thread's registers: Others.Leaf
	RegsUContext                  // saved by a signal: the ucontext at Others.UContext
)

// Others locates a frame's general-purpose registers (REGS_* in bpf/unwinder.h).
type Others struct {
	Source   RegSource
	Leaf     *[unwind.NumGPR]uint64 // by DWARF number
	UContext uint64
}

// StepResult says how a step ended.
type StepResult uint8

const (
	// StepOK: Regs now describe the caller.
	StepOK StepResult = iota
	// StepEnd: the frame is the outermost one; the walk is complete.
	StepEnd
	// StepBadRead: the rule named memory that could not be read.
	StepBadRead
	// StepInvalid: the rule is one the unwinder does not know.
	StepInvalid
	// StepNoRow: no call frame information covers the PC.
	StepNoRow
	// StepExpression: the CFA is an expression the unwinder does not evaluate.
	StepExpression
	// StepRegister: the rule needs a register the frame does not know.
	StepRegister
	// StepRAElsewhere: the return address is not at CFA-8.
	StepRAElsewhere
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
	case StepNoRow:
		return "no row"
	case StepExpression:
		return "expression"
	case StepRegister:
		return "register"
	case StepRAElsewhere:
		return "return address elsewhere"
	}
	return "unknown"
}

// reg reads a general-purpose register of the frame by its DWARF number.
func (r Regs) reg(n uint8, read func(uint64) (uint64, bool)) (uint64, StepResult) {
	switch {
	case n == unwind.RegSP:
		return r.SP, StepOK
	case n == unwind.RegFP:
		return r.FP, StepOK
	case n >= unwind.NumGPR:
		return 0, StepRegister
	case r.Others.Source == RegsLeaf:
		if r.Others.Leaf == nil {
			return 0, StepRegister
		}
		return r.Others.Leaf[n], StepOK
	case r.Others.Source == RegsUContext:
		v, ok := read(r.Others.UContext + unwind.UContextOffset[n])
		if !ok {
			return 0, StepBadRead
		}
		return v, StepOK
	}
	return 0, StepRegister
}

// Step unwinds one frame with row, the rule governing regs.PC, exactly as the kernel
// unwinder does on x86-64. read returns the 8-byte word at an address, or false if the
// address cannot be read. Rows without call frame information of their own, CFAFramePointer
// and CFAGo, are Walk's to follow: Step refuses them.
//
// A frame pointer that the row cannot recover (FPInvalid) comes back as 0, because a stale
// value would send a later CFAFP row to a wrong but readable address; with 0, that row's
// read of the return address fails instead.
//
// After a CFASignal step PC is the interrupted instruction rather than a return address,
// so the caller must look it up as is, not as PC-1; its registers are in the ucontext.
func Step(row unwind.Row, regs Regs, read func(addr uint64) (uint64, bool)) (Regs, StepResult) {
	var cfa uint64
	switch row.CFA {
	case unwind.CFASP:
		cfa = regs.SP + uint64(int64(row.CFAOffset))
	case unwind.CFAFP:
		cfa = regs.FP + uint64(int64(row.CFAOffset))
	case unwind.CFAReg:
		v, res := regs.reg(row.CFAReg, read)
		if res != StepOK {
			return regs, res
		}
		cfa = v + uint64(int64(row.CFAOffset))
	case unwind.CFADeref:
		addr, res := regs.reg(row.CFAReg, read)
		if res != StepOK {
			return regs, res
		}
		addr += uint64(int64(row.CFAOffset))
		if row.CFAIndex&unwind.CFAIndex != 0 {
			x, res := regs.reg(row.CFAIndex&15, read)
			if res != StepOK {
				return regs, res
			}
			addr += x << ((row.CFAIndex >> 4) & 3)
		}
		v, ok := read(addr)
		if !ok {
			return regs, StepBadRead
		}
		cfa = v + uint64(int64(row.CFAPost))
	case unwind.CFAPLT:
		// A lazy PLT entry is jmpq *GOT (offsets 0-5), pushq $index (6-10), jmpq PLT0
		// (11-15): the pushed word is on the stack only from offset 11.
		cfa = regs.SP + 8
		if regs.PC&15 >= 11 {
			cfa += 8
		}
	case unwind.CFASignal:
		pc, ok1 := read(regs.SP + unwind.SignalPCOffset)
		sp, ok2 := read(regs.SP + unwind.SignalSPOffset)
		fp, ok3 := read(regs.SP + unwind.SignalFPOffset)
		if !ok1 || !ok2 || !ok3 {
			return regs, StepBadRead
		}
		return Regs{PC: pc, SP: sp, FP: fp, Others: Others{Source: RegsUContext, UContext: regs.SP}}, StepOK
	case unwind.CFAEndOfStack:
		return regs, StepEnd
	case unwind.CFAInvalid:
		return regs, StepNoRow
	case unwind.CFAExpression:
		return regs, StepExpression
	case unwind.CFARAElsewhere:
		return regs, StepRAElsewhere
	default:
		return regs, StepInvalid
	}

	pc, ok := read(cfa - 8)
	if !ok {
		return regs, StepBadRead
	}
	next := Regs{PC: pc, SP: cfa, FP: regs.FP}
	var at uint64
	switch row.FP {
	case unwind.FPAtCFA:
		at = cfa
	case unwind.FPAtFP:
		at = regs.FP
	case unwind.FPAtSP:
		at = regs.SP
	case unwind.FPInvalid:
		next.FP = 0
		return next, StepOK
	default:
		return next, StepOK
	}
	fp, ok := read(at + uint64(int64(row.FPOffset)))
	if !ok {
		return regs, StepBadRead
	}
	next.FP = fp
	return next, StepOK
}
