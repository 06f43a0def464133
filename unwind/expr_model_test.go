package unwind_test

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/sonde-profiler/sonde/unwind"
	"github.com/sonde-profiler/sonde/unwind/walkmodel"
)

// TestExpressionsMatchDWARF checks the symbolic evaluation of CFA expressions against
// a concrete DWARF stack machine: where sonde turns an expression into a row, the CFA
// the kernel's rule computes (Step) must be what the expression computes, for any
// registers and memory.
func TestExpressionsMatchDWARF(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	mem := func(a uint64) uint64 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], a*0x9e3779b97f4a7c15)
		return binary.LittleEndian.Uint64(b[:]) >> 8 // keeps CFAs clear of wrapping around
	}
	read := func(a uint64) (uint64, bool) { return mem(a), true }
	followed, compared := map[unwind.CFARule]int{}, 0
	for range 50000 {
		e := unwind.RandomExpr(r)
		row := unwind.ExprRow(e)
		followed[row.CFA]++
		var regs [unwind.NumGPR]uint64
		for i := range regs {
			regs[i] = r.Uint64() >> 16
		}
		want, ok := unwind.DwarfMachine(e, &regs, mem)
		if row.CFA == unwind.CFAExpression || row.CFA == unwind.CFAPLT {
			continue
		}
		if !ok {
			t.Fatalf("% x: sonde follows it as %s, a DWARF machine fails on it", e, row.String())
		}
		from := walkmodel.Regs{SP: regs[unwind.RegSP], FP: regs[unwind.RegFP], Others: walkmodel.Others{Source: walkmodel.RegsLeaf, Leaf: &regs}}
		next, res := walkmodel.Step(row, from, read)
		if res != walkmodel.StepOK || next.SP != want {
			t.Fatalf("% x as %s: CFA %#x (%s), the expression computes %#x", e, row.String(), next.SP, res, want)
		}
		compared++
	}
	if followed[unwind.CFADeref] < 10000 || followed[unwind.CFAReg]+followed[unwind.CFASP]+followed[unwind.CFAFP] < 5000 || followed[unwind.CFAExpression] < 5000 {
		t.Errorf("too few of each kind: %v", followed)
	}
	t.Logf("%d expressions compared; rules %v", compared, followed)
}
