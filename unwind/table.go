package unwind

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
