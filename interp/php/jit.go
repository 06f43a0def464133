package php

import (
	"debug/elf"

	"github.com/sonde-profiler/sonde/unwind"
)

// ExecFrame is execute_ex's native frame in its body, where the VM's handlers run and
// jump into opcache's JIT code: the CFA is CFA bytes above sp, or above rbp (FromFP) where
// it keeps a frame pointer; the caller's rbp is saved FP bytes below the CFA (0: not
// saved, rbp still holds it).
type ExecFrame struct {
	CFA, FP int
	FromFP  bool
}

// execFrame reads execute_ex's frame from the file's call frame information: the rule that
// governs most of its bytes is its body's, past the prologue and before the epilogues.
// The rows are sampled every few bytes rather than listed, one lookup each. x86-64 only:
// the kernel walks JIT code only there.
func execFrame(f *elf.File, t *unwind.Table, start, end uint64) ExecFrame {
	if f.Machine != elf.EM_X86_64 || t == nil || end <= start {
		return ExecFrame{}
	}
	counts := map[ExecFrame]int{}
	best, most := ExecFrame{}, 0
	step := max((end-start)/4096, 1)
	for pc := start; pc < end; pc += step {
		r, ok := t.Lookup(pc)
		if !ok || (r.CFA != unwind.CFASP && r.CFA != unwind.CFAFP) || r.CFAOffset <= 0 || r.CFAOffset > 1<<15 {
			continue
		}
		fr := ExecFrame{CFA: int(r.CFAOffset), FromFP: r.CFA == unwind.CFAFP}
		switch r.FP {
		case unwind.FPAtCFA:
			if r.FPOffset >= 0 || -r.FPOffset > r.CFAOffset {
				continue
			}
			fr.FP = int(-r.FPOffset)
		case unwind.FPUnchanged:
		default:
			continue
		}
		counts[fr]++
		if counts[fr] > most {
			best, most = fr, counts[fr]
		}
	}
	return best
}
