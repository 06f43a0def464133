package unwind

import "debug/elf"

// FramePointerCodeFunc finds code in an ELF file that keeps frame pointers but has no call
// frame information by design, such as a JIT's builtins compiled into the file (V8's
// embedded builtins in node): ranges of ELF virtual addresses, [start, end).
type FramePointerCodeFunc func(f *elf.File) [][2]uint64

// withFramePointerCode overlays the frame-pointer code finders find in ef.
func withFramePointerCode(t *Table, ef *elf.File, finders []FramePointerCodeFunc) {
	for _, find := range finders {
		for _, r := range find(ef) {
			t.Rows = replaceRange(t.Rows, []Row{{PC: r[0], CFA: CFAFramePointer}}, r[0], r[1])
		}
	}
}
