package unwind

import (
	"testing"
	"unsafe"
)

// A large binary's table is built as Rows before it goes to the kernel: their size is
// the agent's largest transient allocation on a busy host, and a field added carelessly
// would grow it by a third.
func TestRowSize(t *testing.T) {
	if got := unsafe.Sizeof(Row{}); got > 24 {
		t.Errorf("a Row takes %d bytes, want at most 24", got)
	}
	if got := unsafe.Sizeof(KernelRow{}); got != 16 {
		t.Errorf("a KernelRow takes %d bytes, want the kernel's 16", got)
	}
}
