/* x86-64 facts the kernel programs need: where the registers the unwinder starts from
 * live in the kernel's struct pt_regs, where a signal frame keeps the interrupted
 * registers, and where a thread's TLS begins. Package unwind's arch_amd64.go holds the same
 * offsets for its Go model. */
#ifndef SONDE_ARCH_H
#define SONDE_ARCH_H

/* The kernel's struct pt_regs (arch/x86/include/asm/ptrace.h), which bpf_task_pt_regs
 * points at: the user registers saved when the task entered the kernel. */
struct arch_regs {
	__u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	__u64 ax, cx, dx, si, di, orig_ax;
	__u64 ip, cs, flags, sp, ss;
};

#define ARCH_PC(r) ((r)->ip)
#define ARCH_SP(r) ((r)->sp)
#define ARCH_FP(r) ((r)->bp)
/* The saved registers are the user's when the task was interrupted in ring 3. */
#define ARCH_USER_MODE(r) (((r)->cs & 3) == 3)

/* Go's register ABI (Go 1.17 on): the running g in r14, a function's first argument in rax. */
#define ARCH_GO_G r14
#define ARCH_GO_ARG0 ax

/* The table walker knows x86-64's call frame conventions: the return address at CFA-8. */
#define ARCH_TABLE_UNWIND 1

/* Offsets of rip, rsp and rbp in the ucontext a signal handler's frame holds (glibc:
 * uc_mcontext.gregs starts at 40; REG_RIP=16, REG_RSP=15, REG_RBP=10). When __restore_rt
 * runs, the handler's ret has popped pretcode, so SP points at the ucontext itself. */
#define UCONTEXT_PC 168
#define UCONTEXT_SP 160
#define UCONTEXT_FP 120

/* DWARF's numbers of the registers the walker tracks in every frame. */
#define DWARF_FP 6
#define DWARF_SP 7
/* General-purpose registers, DWARF numbers 0-15: rax rdx rcx rbx rsi rdi rbp rsp r8-r15. */
#define DWARF_GPRS 16

/* Where each general-purpose register, by DWARF number, is in struct pt_regs (struct
 * arch_regs above) and in a ucontext (glibc's REG_* order from uc_mcontext.gregs at 40). */
static const __u8 ptregs_offset[DWARF_GPRS] = {80, 96, 88, 40, 104, 112, 32, 152, 72, 64, 56, 48, 24, 16, 8, 0};
static const __u8 ucontext_offset[DWARF_GPRS] = {144, 136, 152, 128, 112, 104, 120, 160, 40, 48, 56, 64, 72, 80, 88, 96};

/* The thread pointer, where TLS (a thread's trace context, a Go thread's g) is found, and
 * what glibc's pthread_self returns, by which an interpreter's thread states name their
 * threads (a runtime's walker finds the sampled thread's so): the task's FS base, which arch_prctl(ARCH_SET_FS), as glibc, musl and the Go
 * runtime set it, writes to the task's thread_struct; only a program writing FS with
 * WRFSBASE itself would leave it stale until its next context switch. A CO-RE flavour of
 * the kernel's types, so that an object built for arm64 never names them. */
struct thread_struct___x86 {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct task_struct___x86 {
	struct thread_struct___x86 thread;
} __attribute__((preserve_access_index));

/* The thread pointer of task, a struct task_struct * from bpf_get_current_task_btf. A macro,
 * as ARCH_PC is, for testdata/walker.c compiles this header natively too. */
#define ARCH_THREAD_POINTER(task) (((struct task_struct___x86 *)(task))->thread.fsbase)

#endif
