package unwind

import (
	"fmt"
	"math"
	"structs"
	"unsafe"
)

// CFARule says how the canonical frame address of a row is found.
type CFARule uint8

const (
	// CFAInvalid: no unwind information covers the address (a gap between FDEs, code
	// before the first), or the FDE's program could not be read.
	CFAInvalid CFARule = iota
	// CFASP: CFA = stack pointer + CFAOffset.
	CFASP
	// CFAFP: CFA = frame pointer + CFAOffset.
	CFAFP
	// CFAPLT: the expression gcc and ld emit for PLT entries:
	// CFA = SP + 8 + ((PC & 15) >= 11 ? 8 : 0).
	CFAPLT
	// CFASignal: a signal trampoline (__restore_rt); the interrupted registers are in the
	// ucontext on the stack, at SP + the offsets of uc_mcontext.
	CFASignal
	// CFAEndOfStack: the return address is undefined: this is the outermost frame
	// (_start, clone's child), and the walk is complete.
	CFAEndOfStack
	// CFAReg: CFA = register CFAReg + CFAOffset, for a register other than rsp and rbp
	// (hand-written prologues keep the CFA in rax or r11, gcc's stack realignment in
	// r10). Only the frame the thread was interrupted in knows such a register.
	CFAReg
	// CFADeref: CFA = *(register CFAReg + CFAOffset [+ index register << scale]) +
	// CFAPost: the DWARF expressions of stack realignment (gcc's DRAP: *(rbp-8)) and of
	// hand-written assembly that saves its caller's stack pointer in its frame
	// (OpenSSL's: *(rsp+N)+8, *(rsp+8+r9*8)+8). See CFAIndex.
	CFADeref
	// CFAFramePointer: code without call frame information by design, such as Go's,
	// which keeps frame pointers: walk it by frame pointer.
	CFAFramePointer
	// CFAGo: a Go runtime function that switches stacks, or is the outermost frame of
	// one; CFAReg holds its GoFunc.
	CFAGo
	// CFAExpression: a CFA expression outside the forms above. The walk ends here, and
	// counts it.
	CFAExpression
	// CFARAElsewhere: the return address is not saved at CFA-8 (a register or expression
	// rule, as in longjmp-like code). The walk ends here, and counts it.
	CFARAElsewhere
	// CFARuleCount is how many rules there are: CFA_RULE_MAX in bpf/types.h.
	CFARuleCount int = iota
)

// FPRule says where the caller's frame pointer is.
type FPRule uint8

const (
	// FPUnchanged: the frame pointer register still holds the caller's value.
	FPUnchanged FPRule = iota
	// FPAtCFA: the caller's frame pointer was saved at CFA + FPOffset.
	FPAtCFA
	// FPInvalid: saved in a way the unwinder cannot follow (another register, an
	// expression of another form); the walk continues but the frame pointer is no longer
	// known.
	FPInvalid
	// FPAtFP: saved at the frame's own frame pointer + FPOffset, as gcc's stack
	// realignment describes it (DW_CFA_expression rbp: DW_OP_breg6).
	FPAtFP
	// FPAtSP: saved at the stack pointer + FPOffset (DW_CFA_expression rbp: DW_OP_breg7).
	FPAtSP
	// FPRuleCount is how many rules there are: FP_RULE_MAX in bpf/types.h.
	FPRuleCount int = iota
)

// GoFunc is what a Go runtime function does to a stack walk: the CFAReg of a CFAGo row,
// enum go_func in bpf/types.h.
type GoFunc uint8

const (
	GoFuncNone GoFunc = iota
	// GoFuncTop: runtime.goexit, mstart, rt0_go, mcall: the outermost frame of a
	// goroutine or of a thread's g0 stack. mcall leaves g0 with the scheduler, which runs
	// for no goroutine; Go's own tracebacks end there too.
	GoFuncTop
	// GoFuncSystemstack: runtime.systemstack ran a function on g0; its caller's frame is
	// on the goroutine's stack, where curg.sched.sp points.
	GoFuncSystemstack
	// GoFuncMorestack: runtime.morestack called newstack on g0 for a function stopped in
	// its prologue, at curg.sched.pc, before it set up a frame.
	GoFuncMorestack
	// GoFuncAsmcgocall: C code runs on g0; runtime.asmcgocall left the goroutine and its
	// stack depth at its own stack pointer.
	GoFuncAsmcgocall
	// GoFuncFPSwitch: a function whose frame is on one stack while its callee runs on
	// another: runtime.cgocallback set up its frame on g0 and runs Go code on the
	// goroutine's stack, its frame pointer leading back to C; time.now,
	// runtime.walltime and nanotime1 call the vDSO on g0 from frames on the goroutine's
	// stack.
	GoFuncFPSwitch
	// GoFuncCount is how many there are: GO_FUNC_MAX.
	GoFuncCount int = iota
)

// CFAIndex marks a CFADeref row's CFAIndex as used: CFAIndex | scale<<4 | register adds
// register<<scale to the address before the dereference.
const CFAIndex = 0x80

// Row governs the addresses from PC up to the next row's PC. On x86-64 the return
// address is always at CFA-8; an arm64 port adds a rule for it.
//
// The fields are ordered so that a row takes 24 bytes, not 32: a large binary's table is
// built with a million rows or more before it goes to the kernel, and that is the agent's
// largest transient allocation.
type Row struct {
	PC        uint64 // ELF virtual address where the row starts
	CFAOffset int32
	FPOffset  int32
	// CFAPost is what a CFADeref row adds after the dereference.
	CFAPost int32
	CFA     CFARule
	FP      FPRule
	// CFAReg is the base register of CFAReg and CFADeref rules, by DWARF number, or the
	// GoFunc of a CFAGo row.
	CFAReg uint8
	// CFAIndex is a CFADeref row's index register (see CFAIndex), or 0.
	CFAIndex uint8
}

// Table is a file's unwind rows sorted by PC, consecutive equal rules merged. A row with
// CFAInvalid ends the range of the FDE before it.
type Table struct {
	Rows []Row
	// Source names the section the rows came from: ".eh_frame" or ".debug_frame".
	Source string
}

// Lookup returns the row governing pc, if any.
func (t *Table) Lookup(pc uint64) (Row, bool) {
	lo, hi := 0, len(t.Rows)
	for lo < hi {
		mid := (lo + hi) / 2
		if t.Rows[mid].PC <= pc {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return Row{}, false
	}
	r := t.Rows[lo-1]
	return r, r.CFA != CFAInvalid
}

// AtEntry reports whether pc's row is a function entry's: the CFA is SP plus the call's
// return address and nothing else. The first address of an FDE that is not at an entry
// continues a frame another FDE opened: the part of a function a compiler moved out of
// line (gcc's .cold).
func (t *Table) AtEntry(pc uint64) bool {
	r, ok := t.Lookup(pc)
	return ok && r.CFA == CFASP && r.CFAOffset == entryCFAOffset
}

// KernelRow is a Row as the kernel unwinder stores it: struct unwind_row of bpf/types.h,
// field for field, so that bpf.UnwindRow converts to it and back. Its rules hold the
// values of CFARule and FPRule, which are the kernel's enum values.
type KernelRow struct {
	_         structs.HostLayout
	Pc        uint32
	CfaOffset int32
	FpOffset  int16
	CfaRule   uint8
	FpRule    uint8
	CfaReg    uint8
	CfaIndex  uint8
	CfaPost   int16
}

// Row is the inverse of KernelRows for one row.
func (k KernelRow) Row() Row {
	return Row{PC: uint64(k.Pc), CFA: CFARule(k.CfaRule), FP: FPRule(k.FpRule), CFAOffset: k.CfaOffset, FPOffset: int32(k.FpOffset),
		CFAReg: k.CfaReg, CFAIndex: k.CfaIndex, CFAPost: int32(k.CfaPost)}
}

// KernelRows converts the table to the kernel's rows. The kernel keeps 32-bit addresses
// and 16-bit offsets for the frame pointer and after a dereference: code above 4 GiB
// cannot be described, a frame pointer saved further away than an int16 reaches is
// recorded as unknown, and a dereferencing CFA whose last addend does not fit is an
// expression the kernel does not evaluate.
func (t *Table) KernelRows() ([]KernelRow, error) {
	if n := len(t.Rows); n > 0 && t.Rows[n-1].PC > math.MaxUint32 {
		return nil, fmt.Errorf("unwind: code above 4 GiB of address space (%#x)", t.Rows[n-1].PC)
	}
	// Converted in place: a KernelRow is smaller than a Row, so row i is read before
	// KernelRow i, written at a lower address, overwrites any of it, and the rows after
	// it lie beyond. A large file's rows are not held twice, even for a moment. The
	// table's rows are the KernelRows' from here on.
	rows := t.Rows
	out := unsafe.Slice((*KernelRow)(unsafe.Pointer(unsafe.SliceData(rows))), len(rows))
	for i := range rows {
		out[i] = rows[i].kernel()
	}
	t.Rows = nil
	return out, nil
}

func (r Row) kernel() KernelRow {
	k := KernelRow{Pc: uint32(r.PC), CfaOffset: r.CFAOffset, CfaRule: uint8(r.CFA), FpRule: uint8(r.FP), CfaReg: r.CFAReg, CfaIndex: r.CFAIndex}
	switch r.FP {
	case FPAtCFA, FPAtFP, FPAtSP:
		if r.FPOffset < math.MinInt16 || r.FPOffset > math.MaxInt16 {
			k.FpRule = uint8(FPInvalid)
		} else {
			k.FpOffset = int16(r.FPOffset)
		}
	}
	if r.CFA == CFADeref {
		if r.CFAPost < math.MinInt16 || r.CFAPost > math.MaxInt16 {
			return KernelRow{Pc: k.Pc, CfaRule: uint8(CFAExpression)}
		}
		k.CfaPost = int16(r.CFAPost)
	}
	return k
}

// String says what a row does, for a person: its CFA rule and where the caller's frame
// pointer is (rsp+16 fp=c-16).
func (r Row) String() string {
	var cfa string
	switch r.CFA {
	case CFAInvalid:
		return "invalid"
	case CFASP:
		cfa = fmt.Sprintf("rsp%+d", r.CFAOffset)
	case CFAFP:
		cfa = fmt.Sprintf("rbp%+d", r.CFAOffset)
	case CFAReg:
		cfa = fmt.Sprintf("r%d%+d", r.CFAReg, r.CFAOffset)
	case CFADeref:
		cfa = fmt.Sprintf("*(r%d%+d", r.CFAReg, r.CFAOffset)
		if r.CFAIndex&CFAIndex != 0 {
			cfa += fmt.Sprintf("+r%d<<%d", r.CFAIndex&15, (r.CFAIndex>>4)&3)
		}
		cfa += fmt.Sprintf(")%+d", r.CFAPost)
	case CFAPLT:
		cfa = "plt"
	case CFASignal:
		return "signal"
	case CFAEndOfStack:
		return "end"
	case CFAExpression:
		return "expression"
	case CFARAElsewhere:
		return "ra elsewhere"
	case CFAFramePointer:
		return "frame pointer"
	case CFAGo:
		return fmt.Sprintf("go %d", r.CFAReg)
	default:
		cfa = fmt.Sprintf("cfa?%d", r.CFA)
	}
	switch r.FP {
	case FPUnchanged:
		return cfa + " fp=u"
	case FPAtCFA:
		return fmt.Sprintf("%s fp=c%+d", cfa, r.FPOffset)
	case FPAtFP:
		return fmt.Sprintf("%s fp=rbp%+d", cfa, r.FPOffset)
	case FPAtSP:
		return fmt.Sprintf("%s fp=rsp%+d", cfa, r.FPOffset)
	case FPInvalid:
		return cfa + " fp=invalid"
	}
	return fmt.Sprintf("%s fp?%d", cfa, r.FP)
}
