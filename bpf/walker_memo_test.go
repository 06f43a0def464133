//go:build amd64

package bpf

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/sonde-profiler/sonde/unwind"
)

// memoStack is a walk of frames at pcs (the leaf's first, then return addresses), each
// frame 16 bytes of stack holding its saved frame pointer and return address, all in
// one mapping whose table has one row: CFA = SP+16, the frame pointer at CFA-16.
func memoStack(name string, again bool, pcs ...uint64) *walkCase {
	const sp = 0x7ffd_0000_1000
	stack := make([]byte, 16*len(pcs))
	for i := range pcs {
		ra := uint64(0) // the outermost frame's: the walk ends there
		if i+1 < len(pcs) {
			ra = pcs[i+1]
		}
		binary.LittleEndian.PutUint64(stack[16*i+8:], ra)
	}
	c := &walkCase{
		name:   name,
		again:  again,
		maps:   []unwind.KernelMapping{{Start: 0x400000, End: 0x800000, TableId: 1, RowsCount: 1}},
		tables: map[uint32][]unwind.KernelRow{1: {{Pc: 0x400000, CfaOffset: 16, FpOffset: -16, CfaRule: CFASP, FpRule: FPAtCFA, CfaReg: 7}}},
		mem:    []memRegion{{addr: sp, b: stack}},
	}
	c.thread.PC = pcs[0]
	c.thread.GPR[7] = sp
	return c
}

// TestRowMemoKeepsFrequentFrames: the memo of rows (types.h, struct row_memo) keeps the
// frames every sample shows, up to four that share a set, while a leaf that differs at
// each sample (compiled code's) passes through; a new writing of the mappings searches
// again. The frames here all fall in one set.
func TestRowMemoKeepsFrequentFrames(t *testing.T) {
	// (pc ^ pc>>8) % 64, the set of struct row_memo: 16 for each of these.
	inSet := func(k uint64) uint64 { return 0x400010 + k*0x4000 }
	for k := range uint64(32) {
		if pc := inSet(k); (pc^pc>>8)%64 != 16 {
			t.Fatalf("pc %#x in set %d", pc, (pc^pc>>8)%64)
		}
	}
	stable := []uint64{inSet(1), inSet(2), inSet(3)}
	var cases []*walkCase
	var want []int
	add := func(again bool, searches int, pcs ...uint64) {
		cases = append(cases, memoStack(fmt.Sprintf("case %d", len(cases)), again, pcs...))
		want = append(want, searches)
	}
	add(false, 4, append([]uint64{inSet(10)}, stable...)...)
	for j := range uint64(8) {
		// Another leaf each time: only it is searched.
		add(true, 1, append([]uint64{inSet(11 + j)}, stable...)...)
	}
	add(true, 0, append([]uint64{inSet(18)}, stable...)...)  // the last leaf again
	add(false, 4, append([]uint64{inSet(18)}, stable...)...) // the mappings written again
	// Five frames in a set of four ways: each sample searches one at least.
	add(true, 1, append([]uint64{inSet(18), inSet(4)}, stable...)...)
	got := compareWalkers(t, cases)
	for i, r := range got {
		if len(r.frames) != 1+len(stable) && len(r.frames) != 2+len(stable) || r.end != uint32(UnwindComplete) {
			t.Errorf("%s: %v", cases[i].name, r)
		}
		if i < len(cases)-1 && r.searches != want[i] || i == len(cases)-1 && r.searches < want[i] {
			t.Errorf("%s: %d tables searched, want %d", cases[i].name, r.searches, want[i])
		}
	}
}
