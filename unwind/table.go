package unwind

import (
	"fmt"
	"math"
	"structs"
)

// CFARule says how the canonical frame address of a row is found.
type CFARule uint8

const (
	// CFAInvalid: no unwind information covers the address (a gap between FDEs), or the
	// compiler's rule is one the unwinder cannot follow.
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
	// FPInvalid: saved in a way the unwinder cannot follow (an expression, another register);
	// the walk continues but the frame pointer is no longer known.
	FPInvalid
	// FPRuleCount is how many rules there are: FP_RULE_MAX in bpf/types.h.
	FPRuleCount int = iota
)

// Row governs the addresses from PC up to the next row's PC. On x86-64 the return
// address is always at CFA-8; an arm64 port adds a rule for it.
type Row struct {
	PC        uint64 // ELF virtual address where the row starts
	CFA       CFARule
	FP        FPRule
	CFAOffset int32
	FPOffset  int32
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
}

// Row is the inverse of KernelRows for one row.
func (k KernelRow) Row() Row {
	return Row{PC: uint64(k.Pc), CFA: CFARule(k.CfaRule), FP: FPRule(k.FpRule), CFAOffset: k.CfaOffset, FPOffset: int32(k.FpOffset)}
}

// KernelRows converts the table to the kernel's rows. The kernel keeps 32-bit addresses
// and 16-bit frame pointer offsets: code above 4 GiB cannot be described, and a frame
// pointer saved further from the CFA than an int16 reaches is recorded as unknown.
func (t *Table) KernelRows() ([]KernelRow, error) {
	if n := len(t.Rows); n > 0 && t.Rows[n-1].PC > math.MaxUint32 {
		return nil, fmt.Errorf("unwind: code above 4 GiB of address space (%#x)", t.Rows[n-1].PC)
	}
	out := make([]KernelRow, len(t.Rows))
	for i, r := range t.Rows {
		k := KernelRow{Pc: uint32(r.PC), CfaOffset: r.CFAOffset, CfaRule: uint8(r.CFA), FpRule: uint8(r.FP)}
		if r.FP == FPAtCFA {
			if r.FPOffset < math.MinInt16 || r.FPOffset > math.MaxInt16 {
				k.FpRule = uint8(FPInvalid)
			} else {
				k.FpOffset = int16(r.FPOffset)
			}
		}
		out[i] = k
	}
	return out, nil
}
