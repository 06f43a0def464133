package unwind

import "debug/elf"

// machine is the ELF machine whose call frame information this package turns into rows.
const machine = elf.EM_X86_64

// Offsets into the ucontext_t that the kernel pushes for a signal handler, as glibc's
// x86-64 <sys/ucontext.h> lays it out: uc_flags, uc_link and a 24-byte stack_t precede
// uc_mcontext.gregs, and REG_RBP=10, REG_RSP=15, REG_RIP=16 index it. When __restore_rt
// runs, the handler's ret has popped pretcode, so SP points at the ucontext itself.
// bpf/arch_x86.h holds the same offsets for the kernel's walker.
const (
	ucontextGregs  = 40
	SignalFPOffset = ucontextGregs + 8*10 // 120
	SignalSPOffset = ucontextGregs + 8*15 // 160
	SignalPCOffset = ucontextGregs + 8*16 // 168
)

// UContextOffset is where a ucontext keeps each general-purpose register, by DWARF number
// (rax rdx rcx rbx rsi rdi rbp rsp r8-r15): glibc's REG_* order from uc_mcontext.gregs.
var UContextOffset = [NumGPR]uint64{144, 136, 152, 128, 112, 104, 120, 160, 40, 48, 56, 64, 72, 80, 88, 96}

// tableArch: rows for this architecture can be built and walked.
const tableArch = true

// entryCFAOffset is the CFA's offset from SP at a function's first instruction: the
// call's return address alone is on the stack.
const entryCFAOffset = 8
