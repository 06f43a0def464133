package unwind

import "debug/elf"

// FramePointerCodeFunc finds code in an ELF file that keeps frame pointers but has no call
// frame information by design, such as a JIT's builtins compiled into the file (V8's
// embedded builtins in node): ranges of ELF virtual addresses, [start, end).
type FramePointerCodeFunc func(f *elf.File) [][2]uint64
