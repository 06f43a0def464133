package unwind

import (
	"debug/elf"
	"sync"
)

// FramePointerCodeFunc finds code in an ELF file that keeps frame pointers but has no call
// frame information by design, such as a JIT's builtins compiled into the file (V8's
// embedded builtins in node): ranges of ELF virtual addresses, [start, end).
type FramePointerCodeFunc func(f *elf.File) [][2]uint64

var fpCode struct {
	mu    sync.Mutex
	funcs []FramePointerCodeFunc
}

// RegisterFramePointerCode adds a finder of such code: a file's table walks what it finds
// by frame pointer, where it would otherwise end the walk for want of a row. Language
// runtimes register theirs at init.
func RegisterFramePointerCode(f FramePointerCodeFunc) {
	fpCode.mu.Lock()
	fpCode.funcs = append(fpCode.funcs, f)
	fpCode.mu.Unlock()
}

// withFramePointerCode overlays the frame-pointer code the registered finders find in ef.
func withFramePointerCode(t *Table, ef *elf.File) {
	fpCode.mu.Lock()
	funcs := fpCode.funcs
	fpCode.mu.Unlock()
	for _, find := range funcs {
		for _, r := range find(ef) {
			t.Rows = replaceRange(t.Rows, []Row{{PC: r[0], CFA: CFAFramePointer}}, r[0], r[1])
		}
	}
}
