// The steps model x86-64 signal frames and PLT stubs.

//go:build amd64

package walkmodel

import (
	"testing"

	"github.com/sonde-profiler/sonde/unwind"
)

// fakeStack is a sparse memory image; addresses not in it cannot be read.
type fakeStack map[uint64]uint64

func (m fakeStack) read(addr uint64) (uint64, bool) {
	v, ok := m[addr]
	return v, ok
}

func TestStepWalk(t *testing.T) {
	// A stack of: leaf (CFA on rsp) → a function with rbp as frame pointer → a PLT stub
	// → a signal handler's return into __restore_rt → the interrupted function → _start.
	mem := fakeStack{
		0x7000: 0x402005, // leaf's return address
		0x7100: 0x7300,   // fp-based frame's saved rbp
		0x7108: 0x40301b, // its return address, into a PLT entry at offset 11
		0x7118: 0x404000, // PLT's return address: pushed word at 0x7110, RA above it
	}
	const uc = 0x7120      // the PLT frame's CFA: where the handler's ret left rsp
	mem[uc+168] = 0x405055 // interrupted PC
	mem[uc+160] = 0x9000   // interrupted SP
	mem[uc+120] = 0x9100   // interrupted FP
	mem[0x9000+24-8] = 0x406000

	steps := []struct {
		row  unwind.Row
		want Regs
		res  StepResult
	}{
		{unwind.Row{CFA: unwind.CFASP, CFAOffset: 8}, Regs{PC: 0x402005, SP: 0x7008, FP: 0x7100}, StepOK},
		{unwind.Row{CFA: unwind.CFAFP, CFAOffset: 16, FP: unwind.FPAtCFA, FPOffset: -16}, Regs{PC: 0x40301b, SP: 0x7110, FP: 0x7300}, StepOK},
		{unwind.Row{CFA: unwind.CFAPLT}, Regs{PC: 0x404000, SP: 0x7120, FP: 0x7300}, StepOK},
		{unwind.Row{CFA: unwind.CFASignal}, Regs{PC: 0x405055, SP: 0x9000, FP: 0x9100, Others: Others{Source: RegsUContext, UContext: uc}}, StepOK},
		{unwind.Row{CFA: unwind.CFASP, CFAOffset: 24}, Regs{PC: 0x406000, SP: 0x9018, FP: 0x9100}, StepOK},
		{unwind.Row{CFA: unwind.CFAEndOfStack}, Regs{PC: 0x406000, SP: 0x9018, FP: 0x9100}, StepEnd},
	}
	regs := Regs{PC: 0x401000, SP: 0x7000, FP: 0x7100}
	for i, s := range steps {
		got, res := Step(s.row, regs, mem.read)
		if got != s.want || res != s.res {
			t.Fatalf("step %d (%s) from %+v: got %+v %s, want %+v %s", i, s.row.String(), regs, got, res, s.want, s.res)
		}
		regs = got
	}
}

func TestStepPLT(t *testing.T) {
	// Before the pushq completes (offsets 0-10) the CFA is rsp+8, after it rsp+16.
	mem := fakeStack{0x7000: 1, 0x7008: 2}
	for off := uint64(0); off < 16; off++ {
		regs := Regs{PC: 0x401020 + off, SP: 0x7008, FP: 7}
		want := Regs{PC: 2, SP: 0x7010, FP: 7}
		if off >= 11 {
			regs.SP = 0x7000
		}
		got, res := Step(unwind.Row{CFA: unwind.CFAPLT}, regs, mem.read)
		if res != StepOK || got != want {
			t.Errorf("PLT offset %d: got %+v %s, want %+v", off, got, res, want)
		}
	}
}

func TestStepFailures(t *testing.T) {
	mem := fakeStack{0x7008: 0x401000}
	regs := Regs{PC: 0x400000, SP: 0x7000, FP: 0x7100}
	for _, tc := range []struct {
		name   string
		row    unwind.Row
		regs   Regs
		res    StepResult
		wantFP uint64
	}{
		{"no row", unwind.Row{}, regs, StepNoRow, 0},
		{"expression", unwind.Row{CFA: unwind.CFAExpression}, regs, StepExpression, 0},
		{"return address elsewhere", unwind.Row{CFA: unwind.CFARAElsewhere}, regs, StepRAElsewhere, 0},
		{"frame pointer rows are Walk's", unwind.Row{CFA: unwind.CFAFramePointer}, regs, StepInvalid, 0},
		{"register unknown in a caller", unwind.Row{CFA: unwind.CFAReg, CFAReg: 10}, regs, StepRegister, 0},
		{"no such register", unwind.Row{CFA: unwind.CFAReg, CFAReg: 17, CFAOffset: 8}, regs, StepRegister, 0},
		{"unreadable dereference", unwind.Row{CFA: unwind.CFADeref, CFAReg: unwind.RegSP, CFAOffset: 64}, regs, StepBadRead, 0},
		{"end", unwind.Row{CFA: unwind.CFAEndOfStack}, regs, StepEnd, 0},
		{"unreadable return address", unwind.Row{CFA: unwind.CFASP, CFAOffset: 24}, regs, StepBadRead, 0},
		{"unreadable saved rbp", unwind.Row{CFA: unwind.CFASP, CFAOffset: 16, FP: unwind.FPAtCFA, FPOffset: -16}, regs, StepBadRead, 0},
		{"unreadable ucontext", unwind.Row{CFA: unwind.CFASignal}, regs, StepBadRead, 0},
		{"fp lost", unwind.Row{CFA: unwind.CFASP, CFAOffset: 16, FP: unwind.FPInvalid}, regs, StepOK, 0},
		{"fp kept", unwind.Row{CFA: unwind.CFASP, CFAOffset: 16}, regs, StepOK, 0x7100},
		{"cfa on lost fp", unwind.Row{CFA: unwind.CFAFP, CFAOffset: 16}, Regs{PC: 1, SP: 0x7000}, StepBadRead, 0},
		{"unknown rule", unwind.Row{CFA: 200}, regs, StepInvalid, 0},
	} {
		got, res := Step(tc.row, tc.regs, mem.read)
		if res != tc.res {
			t.Errorf("%s: got %s, want %s", tc.name, res, tc.res)
			continue
		}
		if res != StepOK && got != tc.regs {
			t.Errorf("%s: registers changed on failure: %+v", tc.name, got)
		}
		if res == StepOK && got.FP != tc.wantFP {
			t.Errorf("%s: FP %#x, want %#x", tc.name, got.FP, tc.wantFP)
		}
	}
	// A partly readable ucontext is no better than an unreadable one.
	mem = fakeStack{0x7000 + unwind.SignalPCOffset: 1, 0x7000 + unwind.SignalSPOffset: 2}
	if _, res := Step(unwind.Row{CFA: unwind.CFASignal}, regs, mem.read); res != StepBadRead {
		t.Errorf("partial ucontext: got %s", res)
	}
}

// TestStepRules follows the rules of expressions and of registers other than rsp and
// rbp: OpenSSL's *(rsp+8+r9*8)+8, gcc's realignment *(rbp-8) with rbp saved at rbp, a CFA
// kept in r11, each where the frame knows its registers and where it does not.
func TestStepRules(t *testing.T) {
	leaf := &[unwind.NumGPR]uint64{9: 3, 11: 0x7400, 10: 0x7040}
	mem := fakeStack{
		0x7020:          0x7300, // *(rsp+8+r9*8): the caller's rsp, saved by the prologue
		0x7300:          0x401000,
		0x7108 - 8:      0x7180, // *(rbp-8): gcc's DRAP slot
		0x7180 - 8:      0x402000,
		0x7108:          0x7500, // rbp saved at rbp+0
		0x7400 + 16 - 8: 0x403000,
		0x7040 + 8 - 8:  0x404000,
	}
	const uc = 0x8000
	mem[uc+unwind.UContextOffset[9]] = 3
	regs := Regs{PC: 0x400000, SP: 0x7000, FP: 0x7108}
	leafRegs := regs
	leafRegs.Others = Others{Source: RegsLeaf, Leaf: leaf}
	ucRegs := regs
	ucRegs.Others = Others{Source: RegsUContext, UContext: uc}
	mont := unwind.Row{CFA: unwind.CFADeref, CFAReg: unwind.RegSP, CFAOffset: 8, CFAIndex: unwind.CFAIndex | 3<<4 | 9, CFAPost: 8}
	for _, tc := range []struct {
		name string
		row  unwind.Row
		regs Regs
		want Regs
		res  StepResult
	}{
		{"mont in the leaf", mont, leafRegs, Regs{PC: 0x401000, SP: 0x7308, FP: 0x7108}, StepOK},
		{"mont after a signal", mont, ucRegs, Regs{PC: 0x401000, SP: 0x7308, FP: 0x7108}, StepOK},
		{"mont in a caller", mont, regs, regs, StepRegister},
		{"drap", unwind.Row{CFA: unwind.CFADeref, CFAReg: unwind.RegFP, CFAOffset: -8, FP: unwind.FPAtFP}, regs, Regs{PC: 0x402000, SP: 0x7180, FP: 0x7500}, StepOK},
		{"rbp at rsp", unwind.Row{CFA: unwind.CFASP, CFAOffset: 0x308, FP: unwind.FPAtSP, FPOffset: 0x20}, regs, Regs{PC: 0x401000, SP: 0x7308, FP: 0x7300}, StepOK},
		{"cfa in r11", unwind.Row{CFA: unwind.CFAReg, CFAReg: 11, CFAOffset: 16}, leafRegs, Regs{PC: 0x403000, SP: 0x7410, FP: 0x7108}, StepOK},
		{"cfa in r10 unreadable ucontext", unwind.Row{CFA: unwind.CFAReg, CFAReg: 10, CFAOffset: 8}, ucRegs, ucRegs, StepBadRead},
		{"cfa in rsp by number", unwind.Row{CFA: unwind.CFAReg, CFAReg: unwind.RegSP, CFAOffset: 0x48}, regs, Regs{PC: 0x404000, SP: 0x7048, FP: 0x7108}, StepOK},
	} {
		got, res := Step(tc.row, tc.regs, mem.read)
		if res != tc.res || got != tc.want {
			t.Errorf("%s: got %+v %s, want %+v %s", tc.name, got, res, tc.want, tc.res)
		}
	}
}
