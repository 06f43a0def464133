package main

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
	}
	for rule, kernel := range cfa {
		if uint8(rule) != kernel {
			t.Errorf("CFA rule %d is %d in the kernel", rule, kernel)
		}
	}
	if len(cfa) != unwind.CFARuleCount || unwind.CFARuleCount != bpf.CFARuleCount {
		t.Errorf("%d CFA rules named, unwind has %d, the kernel %d", len(cfa), unwind.CFARuleCount, bpf.CFARuleCount)
	}
	fp := map[unwind.FPRule]uint8{unwind.FPUnchanged: bpf.FPUnchanged, unwind.FPAtCFA: bpf.FPAtCFA, unwind.FPInvalid: bpf.FPInvalid}
	for rule, kernel := range fp {
		if uint8(rule) != kernel {
			t.Errorf("FP rule %d is %d in the kernel", rule, kernel)
		}
	}
	if len(fp) != unwind.FPRuleCount || unwind.FPRuleCount != bpf.FPRuleCount {
		t.Errorf("%d FP rules named, unwind has %d, the kernel %d", len(fp), unwind.FPRuleCount, bpf.FPRuleCount)
	}
	ends := map[unwind.End]bpf.UnwindEnd{
		unwind.EndComplete: bpf.UnwindComplete, unwind.EndTruncated: bpf.UnwindTruncated, unwind.EndNoTable: bpf.UnwindNoTable,
		unwind.EndBadRead: bpf.UnwindBadRead, unwind.EndInvalid: bpf.UnwindInvalid, unwind.EndNoUser: bpf.UnwindNoUser,
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
		unsafe.Offsetof(ur.CfaRule) != unsafe.Offsetof(br.CfaRule) || unsafe.Offsetof(ur.FpRule) != unsafe.Offsetof(br.FpRule) {
		t.Error("unwind.KernelRow and bpf.UnwindRow lay out differently")
	}
	var um unwind.KernelMapping
	var bm bpf.ExecMapping
	if unsafe.Sizeof(um) != unsafe.Sizeof(bm) || unsafe.Offsetof(um.Start) != unsafe.Offsetof(bm.Start) ||
		unsafe.Offsetof(um.End) != unsafe.Offsetof(bm.End) || unsafe.Offsetof(um.Bias) != unsafe.Offsetof(bm.Bias) ||
		unsafe.Offsetof(um.TableId) != unsafe.Offsetof(bm.TableId) || unsafe.Offsetof(um.RowsCount) != unsafe.Offsetof(bm.RowsCount) {
		t.Error("unwind.KernelMapping and bpf.ExecMapping lay out differently")
	}
	rows := []unwind.KernelRow{{Pc: 0x1234, CfaOffset: -8, FpOffset: -16, CfaRule: bpf.CFAFP, FpRule: bpf.FPAtCFA}}
	if k := asKernel[bpf.UnwindRow](rows)[0]; k.Pc != 0x1234 || k.CfaOffset != -8 || k.FpOffset != -16 || k.CfaRule != bpf.CFAFP || k.FpRule != bpf.FPAtCFA {
		t.Errorf("row read through the kernel's type: %+v", k)
	}
}
