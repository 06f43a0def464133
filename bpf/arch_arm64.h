/* arm64 facts the kernel programs need. Only frame-pointer walking is supported here:
 * unwind tables for arm64 need a rule for the return address (in x30 until saved), which
 * package unwind does not build yet, so ARCH_TABLE_UNWIND is 0 and the loader walks user
 * stacks with bpf_get_stack. */
#ifndef SONDE_ARCH_H
#define SONDE_ARCH_H

/* The kernel's struct pt_regs begins with struct user_pt_regs (arch/arm64/include/asm/ptrace.h). */
struct arch_regs {
	__u64 regs[31];
	__u64 sp;
	__u64 pc;
	__u64 pstate;
};

#define ARCH_PC(r) ((r)->pc)
#define ARCH_SP(r) ((r)->sp)
#define ARCH_FP(r) ((r)->regs[29])
/* PSR_MODE_MASK is 0xf; EL0t, user mode, is 0. */
#define ARCH_USER_MODE(r) (((r)->pstate & 0xf) == 0)

/* Go's register ABI (Go 1.18 on): the running g in x28, a function's first argument in x0. */
#define ARCH_GO_G regs[28]
#define ARCH_GO_ARG0 regs[0]

#define ARCH_TABLE_UNWIND 0

/* The thread pointer user space addresses TLS by: TPIDR_EL0, which the kernel saves in the
 * task's thread_struct at each context switch. A thread that set it with msr since its
 * last switch (the dynamic loader does, once, for the main thread) is read stale until the
 * next one. A CO-RE flavour of the kernel's types, as arch_x86.h's. */
struct thread_struct___arm64 {
	struct {
		unsigned long tp_value;
	} uw;
} __attribute__((preserve_access_index));

struct task_struct___arm64 {
	struct thread_struct___arm64 thread;
} __attribute__((preserve_access_index));

/* The thread pointer of task, a struct task_struct * from bpf_get_current_task_btf. */
#define ARCH_THREAD_POINTER(task) (((struct task_struct___arm64 *)(task))->thread.uw.tp_value)

#endif
