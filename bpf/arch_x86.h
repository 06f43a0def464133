/* x86-64 facts the kernel programs need: where the registers the unwinder starts from
 * live in the kernel's struct pt_regs, and where a signal frame keeps the interrupted
 * registers. Package unwind's arch_amd64.go holds the same offsets for its Go model. */
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

/* The table walker knows x86-64's call frame conventions: the return address at CFA-8. */
#define ARCH_TABLE_UNWIND 1

/* Offsets of rip, rsp and rbp in the ucontext a signal handler's frame holds (glibc:
 * uc_mcontext.gregs starts at 40; REG_RIP=16, REG_RSP=15, REG_RBP=10). When __restore_rt
 * runs, the handler's ret has popped pretcode, so SP points at the ucontext itself. */
#define UCONTEXT_PC 168
#define UCONTEXT_SP 160
#define UCONTEXT_FP 120

/* The thread pointer (FS base) of a task: what glibc's pthread_self returns, which CPython
 * keeps in each PyThreadState as thread_id (python.h). */
struct thread_struct___arch {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct task_struct___arch {
	struct thread_struct___arch thread;
} __attribute__((preserve_access_index));

#define ARCH_THREAD_POINTER(task) (((struct task_struct___arch *)(task))->thread.fsbase)

#endif
