package unwind

import "testing"

// TestAtEntry: an FDE's first row is a function entry's only where the CFA is SP plus the
// return address; a part of a function moved out of line starts inside its frame.
func TestAtEntry(t *testing.T) {
	tab := &Table{Rows: []Row{
		{PC: 0x1000, CFA: CFASP, CFAOffset: entryCFAOffset},
		{PC: 0x1004, CFA: CFASP, CFAOffset: entryCFAOffset + 16},
		{PC: 0x1100, CFA: CFAInvalid},
		{PC: 0x2000, CFA: CFAFP, CFAOffset: 16},
		{PC: 0x2100, CFA: CFASP, CFAOffset: entryCFAOffset + 0x1b0},
	}}
	for pc, want := range map[uint64]bool{0x1000: true, 0x1004: false, 0x1100: false, 0x2000: false, 0x2100: false, 0x10: false} {
		if got := tab.AtEntry(pc); got != want {
			t.Errorf("AtEntry(%#x) = %v, want %v", pc, got, want)
		}
	}
}
