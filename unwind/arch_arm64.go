package unwind

import "debug/elf"

// machine is the ELF machine whose call frame information this package turns into rows.
// Rows for arm64 need a rule for the return address, which lives in x30 until a function
// saves it; until Row has one, FromELF refuses arm64 files and the kernel walks arm64
// stacks by frame pointer (see bpf/arch_arm64.h).
const machine = elf.EM_AARCH64

// The ucontext offsets of the x86-64 model have no arm64 counterpart yet: signal frames
// are walked by frame pointer there.
const (
	SignalFPOffset = 0
	SignalSPOffset = 0
	SignalPCOffset = 0
)

var UContextOffset [NumGPR]uint64

// tableArch: rows for arm64 cannot be built yet (see arch_arm64.go).
const tableArch = false

// entryCFAOffset is the CFA's offset from SP at a function's first instruction: the
// return address is in the link register, nothing is pushed.
const entryCFAOffset = 0
