package pipeline

import (
	"testing"
	"unsafe"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/unwind"
)

// unwind names the kernel's enums and structs itself, so that it builds without BPF; the
// numbers and layouts must be the kernel's, or the adapter's conversions would lie.
func TestKernelTypesAgree(t *testing.T) {
	cfa := map[unwind.CFARule]uint8{
		unwind.CFAInvalid: bpf.CFAInvalid, unwind.CFASP: bpf.CFASP, unwind.CFAFP: bpf.CFAFP,
		unwind.CFAPLT: bpf.CFAPLT, unwind.CFASignal: bpf.CFASignal, unwind.CFAEndOfStack: bpf.CFAEndOfStack,
		unwind.CFAReg: bpf.CFAReg, unwind.CFADeref: bpf.CFADeref, unwind.CFAFramePointer: bpf.CFAFramePointer,
		unwind.CFAGo: bpf.CFAGo, unwind.CFAExpression: bpf.CFAExpression, unwind.CFARAElsewhere: bpf.CFARAElsewhere,
	}
	for rule, kernel := range cfa {
		if uint8(rule) != kernel {
			t.Errorf("CFA rule %d is %d in the kernel", rule, kernel)
		}
	}
	if len(cfa) != unwind.CFARuleCount || unwind.CFARuleCount != bpf.CFARuleCount {
		t.Errorf("%d CFA rules named, unwind has %d, the kernel %d", len(cfa), unwind.CFARuleCount, bpf.CFARuleCount)
	}
	fp := map[unwind.FPRule]uint8{unwind.FPUnchanged: bpf.FPUnchanged, unwind.FPAtCFA: bpf.FPAtCFA, unwind.FPInvalid: bpf.FPInvalid,
		unwind.FPAtFP: bpf.FPAtFP, unwind.FPAtSP: bpf.FPAtSP}
	for rule, kernel := range fp {
		if uint8(rule) != kernel {
			t.Errorf("FP rule %d is %d in the kernel", rule, kernel)
		}
	}
	if len(fp) != unwind.FPRuleCount || unwind.FPRuleCount != bpf.FPRuleCount {
		t.Errorf("%d FP rules named, unwind has %d, the kernel %d", len(fp), unwind.FPRuleCount, bpf.FPRuleCount)
	}
	goFuncs := map[unwind.GoFunc]uint8{
		unwind.GoFuncTop: bpf.GoFuncTop, unwind.GoFuncSystemstack: bpf.GoFuncSystemstack, unwind.GoFuncMorestack: bpf.GoFuncMorestack,
		unwind.GoFuncAsmcgocall: bpf.GoFuncAsmcgocall, unwind.GoFuncFPSwitch: bpf.GoFuncFPSwitch,
	}
	for f, kernel := range goFuncs {
		if uint8(f) != kernel {
			t.Errorf("Go function kind %d is %d in the kernel", f, kernel)
		}
	}
	// GoFuncNone is not named: the kernel never sees it.
	if len(goFuncs)+1 != unwind.GoFuncCount || unwind.GoFuncCount != bpf.GoFuncCount {
		t.Errorf("%d Go function kinds named, unwind has %d, the kernel %d", len(goFuncs)+1, unwind.GoFuncCount, bpf.GoFuncCount)
	}
	if unwind.CFAIndex != 0x80 {
		t.Errorf("CFAIndex is %#x, the kernel's CFA_INDEX 0x80", unwind.CFAIndex)
	}
	ends := map[unwind.End]bpf.UnwindEnd{
		unwind.EndComplete: bpf.UnwindComplete, unwind.EndCompleteFP: bpf.UnwindCompleteFP, unwind.EndTruncated: bpf.UnwindTruncated,
		unwind.EndNoUser: bpf.UnwindNoUser, unwind.EndFPBroken: bpf.UnwindFPBroken, unwind.EndBadRead: bpf.UnwindBadRead,
		unwind.EndNoRow: bpf.UnwindNoRow, unwind.EndCFAExpression: bpf.UnwindCFAExpression, unwind.EndRegister: bpf.UnwindRegister,
		unwind.EndRARule: bpf.UnwindRARule, unwind.EndNotAbove: bpf.UnwindNotAbove, unwind.EndTableGone: bpf.UnwindTableGone,
		unwind.EndGoSwitch: bpf.UnwindGoSwitch, unwind.EndInvalid: bpf.UnwindInvalid,
	}
	for end, kernel := range ends {
		if uint32(end) != uint32(kernel) {
			t.Errorf("walk end %d is %d in the kernel", end, kernel)
		}
	}
	if len(ends) != unwind.EndCount || unwind.EndCount != bpf.UnwindEndCount {
		t.Errorf("%d walk ends named, unwind has %d, the kernel %d", len(ends), unwind.EndCount, bpf.UnwindEndCount)
	}
	if unwind.MaxDepth != bpf.MaxUserDepth {
		t.Errorf("unwind walks %d frames, the kernel %d", unwind.MaxDepth, bpf.MaxUserDepth)
	}
	var ur unwind.KernelRow
	var br bpf.UnwindRow
	if unsafe.Sizeof(ur) != unsafe.Sizeof(br) || unsafe.Offsetof(ur.Pc) != unsafe.Offsetof(br.Pc) ||
		unsafe.Offsetof(ur.CfaOffset) != unsafe.Offsetof(br.CfaOffset) || unsafe.Offsetof(ur.FpOffset) != unsafe.Offsetof(br.FpOffset) ||
		unsafe.Offsetof(ur.CfaRule) != unsafe.Offsetof(br.CfaRule) || unsafe.Offsetof(ur.FpRule) != unsafe.Offsetof(br.FpRule) ||
		unsafe.Offsetof(ur.CfaReg) != unsafe.Offsetof(br.CfaReg) || unsafe.Offsetof(ur.CfaIndex) != unsafe.Offsetof(br.CfaIndex) ||
		unsafe.Offsetof(ur.CfaPost) != unsafe.Offsetof(br.CfaPost) {
		t.Error("unwind.KernelRow and bpf.UnwindRow lay out differently")
	}
	var ug unwind.KernelGoRuntime
	var bg bpf.GoRuntime
	if unsafe.Sizeof(ug) != unsafe.Sizeof(bg) || unsafe.Offsetof(ug.TlsG) != unsafe.Offsetof(bg.TlsG) ||
		unsafe.Offsetof(ug.G_m) != unsafe.Offsetof(bg.G_m) || unsafe.Offsetof(ug.G_sched) != unsafe.Offsetof(bg.G_sched) ||
		unsafe.Offsetof(ug.M_curg) != unsafe.Offsetof(bg.M_curg) || unsafe.Offsetof(ug.G_status) != unsafe.Offsetof(bg.G_status) ||
		unsafe.Offsetof(ug.GobufSp) != unsafe.Offsetof(bg.GobufSp) ||
		unsafe.Offsetof(ug.GobufPc) != unsafe.Offsetof(bg.GobufPc) || unsafe.Offsetof(ug.GobufBp) != unsafe.Offsetof(bg.GobufBp) ||
		unsafe.Offsetof(ug.G_stackHi) != unsafe.Offsetof(bg.G_stackHi) || unsafe.Offsetof(ug.CgoDepth) != unsafe.Offsetof(bg.CgoDepth) ||
		unsafe.Offsetof(ug.CgoG) != unsafe.Offsetof(bg.CgoG) {
		t.Error("unwind.KernelGoRuntime and bpf.GoRuntime lay out differently")
	}
	var um unwind.KernelMapping
	var bm bpf.ExecMapping
	if unsafe.Sizeof(um) != unsafe.Sizeof(bm) || unsafe.Offsetof(um.Start) != unsafe.Offsetof(bm.Start) ||
		unsafe.Offsetof(um.End) != unsafe.Offsetof(bm.End) || unsafe.Offsetof(um.Bias) != unsafe.Offsetof(bm.Bias) ||
		unsafe.Offsetof(um.TableId) != unsafe.Offsetof(bm.TableId) || unsafe.Offsetof(um.RowsCount) != unsafe.Offsetof(bm.RowsCount) {
		t.Error("unwind.KernelMapping and bpf.ExecMapping lay out differently")
	}
	rows := []unwind.KernelRow{{Pc: 0x1234, CfaOffset: -8, FpOffset: -16, CfaRule: bpf.CFADeref, FpRule: bpf.FPAtCFA, CfaReg: 7, CfaIndex: 0xb9, CfaPost: -24}}
	if k := asKernel[bpf.UnwindRow](rows)[0]; k.Pc != 0x1234 || k.CfaOffset != -8 || k.FpOffset != -16 || k.CfaRule != bpf.CFADeref ||
		k.FpRule != bpf.FPAtCFA || k.CfaReg != 7 || k.CfaIndex != 0xb9 || k.CfaPost != -24 {
		t.Errorf("row read through the kernel's type: %+v", k)
	}
}
