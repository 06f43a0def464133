//go:build ignore

// SPDX-License-Identifier: GPL-2.0
/* sonde's sampler: on every cpu-clock tick, record who ran and their user and kernel stacks. */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "types.h"
#include "arch.h"

char LICENSE[] SEC("license") = "GPL";

/* Only what the programs read of the task, relocated against the running kernel's BTF. */
struct mm_struct {
	unsigned long task_size;
	unsigned long env_end;
} __attribute__((preserve_access_index));

struct task_struct {
	__u64 self_exec_id;
	struct mm_struct *mm;
	int pid;
	int tgid;
	unsigned int flags;
} __attribute__((preserve_access_index));

/* Opaque: only passed to helpers. */
struct bpf_perf_event_data;

/* What the lookup of a frame's mapping reads (CO-RE finds the fields in their unions). */
struct super_block {
	__u32 s_dev;
} __attribute__((preserve_access_index));

struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
	unsigned long vm_flags;
	unsigned long vm_pgoff;
	struct file *vm_file;
} __attribute__((preserve_access_index));

#ifndef barrier_var
#define barrier_var(var) asm volatile("" : "+r"(var))
#endif

#define VM_EXEC 0x4
#define PAGE_SHIFT 12
/* Below the lowest address a mapping may have (vm.mmap_min_addr's default). */
#define MIN_CODE_ADDR 0x10000
/* The kernel keeps mappings at least 128 MiB below the main thread's stack (mmap_base). */
#define MAIN_STACK_SPAN (128ULL << 20)

/* Load-time settings, rewritten by the loader before the verifier sees the program. */
const volatile __u8 filter_pids = 0;
const volatile __u8 filter_cgroups = 0;
const volatile __u8 collect_kernel = 1;
/* 0: user stacks by bpf_get_stack's frame-pointer walk only; 1: table-driven unwinding. */
const volatile __u8 table_unwinding = 1;
/* 1: for samples of images user space has not described yet, check their frame-pointer
 * walks and name the leaf's mapping (bpf_find_vma, 5.17). */
const volatile __u8 vma_hints = 0;
/* Wake the reader once this much waits in the ring (a quarter of it). */
const volatile __u64 ring_wakeup_bytes = 1 << 18;

/* tgids to sample when filter_pids is set; sized by the loader from --pid. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u8);
} target_pids SEC(".maps");

/* cgroup v2 ids whose processes, and their descendants' processes, to sample when
 * filter_cgroups is set; sized by the loader, updated as pods come and go. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, __u8);
} target_cgroups SEC(".maps");

/* Sized by the loader from the sampling rate and CPU count. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* One inner array of rows per file with an unwind table, created by user space at the
 * file's size and removed when no process maps the file any more: tables are reclaimed
 * whole, so the kernel's memory follows what runs now. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_ARRAY);
		__uint(map_flags, BPF_F_INNER_MAP);
		__uint(max_entries, 1);
		__type(key, __u32);
		__type(value, struct unwind_row);
	});
} unwind_tables SEC(".maps");

/* The runtime layout of each Go binary with a table, keyed by the table's id: what following
 * the Go runtime's stack switches reads. Written and removed with the table. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct go_runtime);
} go_runtimes SEC(".maps");

/* Executable mappings per process (tgid), written by user space as it reads /proc. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct proc_info);
} proc_maps SEC(".maps");

/* Each CPU's memo of the rows its walks found (types.h, struct row_memo). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct row_memo);
} row_memos SEC(".maps");

/* The current self_exec_id of processes that exec'd since sonde started, so user space can
 * tell whether a reading of /proc/PID/maps still belongs to the exec it was made for. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} exec_ids SEC(".maps");

/* The event is built here, off the 512-byte BPF stack, then copied to the ring. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sample_event);
} scratch SEC(".maps");

/* A vma_event is built here, then copied to the ring ahead of its sample. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vma_event);
} vma_scratch SEC(".maps");

#include "tracectx.h"

/* Force the enums and structs into BTF so bpf2go can export them. */
const enum event_kind *unused_event_kind __attribute__((unused));
const enum counter *unused_counter __attribute__((unused));
const struct sample_event *unused_sample_event __attribute__((unused));
const struct unwind_row *unused_unwind_row __attribute__((unused));
const struct proc_info *unused_proc_info __attribute__((unused));
const enum unwind_end *unused_unwind_end __attribute__((unused));
const enum cfa_rule *unused_cfa_rule __attribute__((unused));
const enum fp_rule *unused_fp_rule __attribute__((unused));
const enum go_func *unused_go_func __attribute__((unused));
const struct go_runtime *unused_go_runtime __attribute__((unused));
const struct process_event *unused_process_event __attribute__((unused));
const struct vma_event *unused_vma_event __attribute__((unused));
const enum vma_limits *unused_vma_limits __attribute__((unused));
const struct interp_proc *unused_interp_proc __attribute__((unused));
const struct offcpu_start *unused_offcpu_start __attribute__((unused));
const struct offcpu_end_event *unused_offcpu_end_event __attribute__((unused));
const enum interp_frame_encoding *unused_interp_frame_encoding __attribute__((unused));

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);
	if (c)
		(*c)++;
}

static long cgroup_level_step(__u32 i, void *ctx)
{
	int *found = ctx;
	/* Level 0 is the root, which no filter names. */
	__u64 id = bpf_get_current_ancestor_cgroup_id(i + 1);
	if (!id)
		return 1; /* deeper than the task's own cgroup */
	if (bpf_map_lookup_elem(&target_cgroups, &id)) {
		*found = 1;
		return 1;
	}
	return 0;
}

/* A target cgroup is the current task's own or one of its ancestors: a pod's cgroup holds
 * its containers' cgroups. A loop callback, not an unrolled loop, keeps the verifier's work
 * the same whatever MAX_CGROUP_LEVELS is. */
static __always_inline int in_target_cgroup(void)
{
	int found = 0;
	bpf_loop(MAX_CGROUP_LEVELS, cgroup_level_step, &found, 0);
	return found;
}

/* With both filters, a process either names is sampled. */
static __always_inline int wanted(__u32 tgid)
{
	if (!filter_pids && !filter_cgroups)
		return 1;
	if (filter_pids && bpf_map_lookup_elem(&target_pids, &tgid))
		return 1;
	return filter_cgroups && in_target_cgroup();
}

#if ARCH_TABLE_UNWIND
/* The walker's helpers, as unwinder.h asks for them. */
static __always_inline int walker_read_user(__u64 *dst, __u64 addr)
{
	return bpf_probe_read_user(dst, sizeof(*dst), (const void *)addr);
}

static __always_inline int walker_read_pair(__u64 *dst, __u64 addr)
{
	return bpf_probe_read_user(dst, 2 * sizeof(*dst), (const void *)addr);
}

static __always_inline int walker_read_kernel(__u64 *dst, __u64 addr)
{
	return bpf_probe_read_kernel(dst, sizeof(*dst), (const void *)addr);
}

static __always_inline void *walker_table(__u32 table_id)
{
	return bpf_map_lookup_elem(&unwind_tables, &table_id);
}

static __always_inline struct go_runtime *walker_go_runtime(__u32 table_id)
{
	return bpf_map_lookup_elem(&go_runtimes, &table_id);
}

static __always_inline struct unwind_row *walker_row(void *table, __u32 i)
{
	return bpf_map_lookup_elem(table, &i);
}

#define walker_loop(n, fn, ctx) bpf_loop(n, fn, ctx, 0)

#include "unwinder.h"
#endif

/* The language runtimes' walkers, each in its own header with its own maps, listed in
 * runtimes.h; the dispatch below expands the lists and names none of them. */
#include "runtimes.h"

/* Every runtime's number fits the 4 bits frames and regions give it, and no two runtimes
 * share one: a duplicate is a duplicate case label. */
#define RUNTIME_NUMBER_FITS(name, number) \
	_Static_assert((number) > 0 && (number) <= INTERP_RUNTIME_MAX, #name "'s number fits its 4 bits");
SONDE_RUNTIMES(RUNTIME_NUMBER_FITS)
#define RUNTIME_NUMBER_CASE(name, number) case (number):
static __always_inline __attribute__((unused)) void runtime_numbers_are_distinct(__u32 n)
{
	switch (n) {
	SONDE_RUNTIMES(RUNTIME_NUMBER_CASE)
		break;
	}
}

#if ARCH_TABLE_UNWIND
/* walker_no_table (unwinder.h): a frame of code no table describes, or that its table says
 * is walked by frame pointer, may be a JIT's whose runtime walks its frames within the
 * native walk (SONDE_JIT_RUNTIMES: HotSpot's, which keeps no frame pointers; V8's, whose
 * frames keep their function by their frame pointer). The rest is walked by frame
 * pointer. One lookup per runtime and walk tells a process without it: no_jit keeps a bit
 * per runtime number found absent.
 *
 * no_table_step is a global function: the verifier checks it once on its own, where
 * inlined into the loop's callback it was explored at each of the callback's many
 * verified iterations (a fifth of the sample program's verification). */
#define JIT_STEP(name, number)                                                         \
	if (!(*no_jit & (1U << (number)))) {                                           \
		struct name##_proc *p = bpf_map_lookup_elem(&name##_procs, &pid);      \
		if (!p || (p->exec_id && p->exec_id != exec_id)) {                     \
			*no_jit |= 1U << (number);                                     \
		} else if (name##_in_code(p, st->pc)) {                                \
			if (st->n > 0)                                                 \
				st->n--; /* recorded again, as the runtime's */        \
			return name##_frames(st, frames, p, pid, exec_id);             \
		}                                                                      \
	}
__noinline long no_table_step(struct unwind_state *st, struct user_frames *frames, __u32 pid, __u64 exec_id, __u16 *no_jit)
{
	if (!st || !frames || !no_jit)
		return 1;
	SONDE_JIT_RUNTIMES(JIT_STEP)
	return fp_step(st);
}

static long walker_no_table(struct walk *w)
{
	return no_table_step(&w->st, w->frames, w->pid, w->exec_id, &w->no_jit);
}
#endif

/* Which runtimes a process runs, and the code regions that are theirs: one lookup per
 * sample tells a process without any. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct interp_proc);
} interp_procs SEC(".maps");

/* interp_forget drops what user space said of a process's runtimes, at its exec or exit. */
#define RUNTIME_FORGET(name, number) name##_forget(tgid);
static __always_inline void interp_forget(__u32 tgid)
{
	bpf_map_delete_elem(&interp_procs, &tgid);
	SONDE_RUNTIMES(RUNTIME_FORGET)
}

#if ARCH_TABLE_UNWIND
struct interp_scan {
	struct interp_proc *proc;
	__u64 *frames;
	__u32 n;
	__u32 hit; /* a bit per runtime some native frame lies in */
};

static long interp_scan_step(__u32 i, void *ctx)
{
	struct interp_scan *s = ctx;
	if (i >= s->n)
		return 1;
	__u64 pc = s->frames[i & (MAX_USER_DEPTH - 1)];
	for (__u32 r = 0; r < MAX_INTERP_REGIONS; r++) {
		if (r >= s->proc->count)
			break;
		struct interp_region *reg = &s->proc->regions[r];
		/* A return address points after its call, which may be the region's last byte. */
		if (pc >= reg->start && pc <= reg->end)
			s->hit |= 1U << (reg->runtime & INTERP_RUNTIME_MAX);
	}
	return 0;
}

/* interp_frames hands the sample's n native frames to the walker of each runtime whose
 * frames are found after the walk (SONDE_STATE_RUNTIMES: Python's, in its interpreter's
 * state) and whose code one of them runs, which puts the runtime's frames in, and returns
 * how many frames there are then. A walk that stopped short of the outermost frame
 * (complete 0) may have left a runtime's frames beyond it: every such runtime of the
 * process is asked then. Each walker is a global function, verified once on its own. */
#define STATE_BIT(name, number) | (1U << (number))
#define STATE_WALK(name, number)          \
	if (s.hit & (1U << (number)))    \
		n = name##_frames(e, n, complete);
static __always_inline __u32 interp_frames(struct sample_event *e, __u32 n, __u32 complete)
{
	__u32 pid = e->pid;
	struct interp_proc *p = bpf_map_lookup_elem(&interp_procs, &pid);
	/* exec_id 0: user space read the process before it knew its exec. The JITs' frames
	 * are in already: their walkers run within the native walk. */
	if (!p || (p->exec_id && p->exec_id != e->exec_id) || n == 0 || !(p->runtimes & (0 SONDE_STATE_RUNTIMES(STATE_BIT))))
		return n;
	if (n > MAX_USER_DEPTH)
		n = MAX_USER_DEPTH;
	struct interp_scan s = {.proc = p, .frames = e->frames, .n = n};
	bpf_loop(n, interp_scan_step, &s, 0);
	if (!complete)
		s.hit |= p->runtimes;
	SONDE_STATE_RUNTIMES(STATE_WALK)
	return n;
}
#endif

/* unwind_user walks the user stack from the registers the task entered the kernel with.
 * It returns whether the process's unwinder mappings were usable, so that the first sample
 * of a process user space does not know yet wakes the reader at once. */
static __always_inline int unwind_user(struct sample_event *e, struct task_struct *task, __u32 tgid)
{
#if ARCH_TABLE_UNWIND
	struct arch_regs regs;
	__u64 pt_regs = (__u64)bpf_task_pt_regs(task);
	if (bpf_probe_read_kernel(&regs, sizeof(regs), (void *)pt_regs) || !ARCH_USER_MODE(&regs)) {
		e->user_len = 0;
		e->unwind_end = UNWIND_NO_USER;
		return 1;
	}
	struct proc_info *proc = bpf_map_lookup_elem(&proc_maps, &tgid);
	if (proc && proc->exec_id && proc->exec_id != e->exec_id) {
		/* Written for an earlier exec: its addresses mean nothing now. Looking up tgid 0,
		 * which never has mappings, rather than assigning NULL keeps proc one type for the
		 * verifier, which otherwise explores the walk for each and takes 20 times longer. */
		count(COUNTER_STALE_MAPPINGS);
		__u32 none = 0;
		proc = bpf_map_lookup_elem(&proc_maps, &none);
	}
	__u64 tls = ARCH_THREAD_POINTER(task);
	__u32 end = UNWIND_INVALID;
	__u32 zero = 0;
	struct row_memo *memo = bpf_map_lookup_elem(&row_memos, &zero);
	__u32 n = walk_user((struct user_frames *)e->frames, proc, memo, tgid, e->exec_id, ARCH_PC(&regs), ARCH_SP(&regs), ARCH_FP(&regs),
			    pt_regs, tls, &end);
	/* A walk that reached the outermost frame, by tables or by frame pointer, leaves no
	 * runtime's frames over to put at the root. */
	n = interp_frames(e, n, end == UNWIND_COMPLETE || end == UNWIND_COMPLETE_FP);
	e->user_len = n * sizeof(__u64);
	e->unwind_end = end;
	return proc != NULL;
#else
	return 1;
#endif
}

/* The leaf's mapping, as the lookup's callback found it. */
struct vma_found {
	__u64 start;
	__u64 end;
	__u64 pgoff;
	__u64 inode;
	__u32 dev;
	__u32 exec;
};

static long on_vma(struct task_struct *task, struct vm_area_struct *vma, void *ctx)
{
	struct vma_found *f = ctx;
	f->start = vma->vm_start;
	f->end = vma->vm_end;
	f->pgoff = vma->vm_pgoff;
	f->exec = (vma->vm_flags & VM_EXEC) != 0;
	struct file *file = vma->vm_file;
	if (file) {
		f->inode = file->f_inode->i_ino;
		f->dev = file->f_inode->i_sb->s_dev;
	}
	return 0;
}

struct frame_check {
	struct sample_event *e;
	__u64 sp;         /* the user stack pointer at the sample */
	__u64 stack_top;  /* the end of the environment's strings */
	__u64 task_size;  /* user addresses lie below */
	__u32 frames;     /* user frames of the sample */
	__u32 keep;       /* those to keep */
};

/* A frame-pointer walk through code built without frame pointers reads return addresses
 * out of data: the first that cannot be a return address ends the stack. */
static long frame_check_step(__u32 i, void *ctx)
{
	struct frame_check *c = ctx;
	__u64 idx = i + 1; /* the leaf is the interrupted PC itself */
	barrier_var(idx);  /* one register for the check and the access, for the verifier */
	if (idx >= c->frames || idx >= MAX_VMA_CHECKS)
		return 1;
	__u64 addr = c->e->frames[idx];
	if (addr >> INTERP_FRAME_TAG_SHIFT == INTERP_FRAME_TAG)
		return 0;
	if (addr < MIN_CODE_ADDR || addr >= c->task_size || (addr >= c->sp && addr < c->stack_top)) {
		c->keep = idx;
		return 1;
	}
	return 0;
}

/* check_frames cuts the stack of a process the kernel has no mappings of, walked by frame
 * pointer from the leaf, at the first frame that cannot be a return address: one under the
 * lowest mapping, beyond user space or on the main thread's stack (from the stack pointer
 * up, which also holds the program's arguments and environment, pointers to which a
 * register often holds). Code built without frame pointers leaves data where such a walk
 * looks for them. */
static __always_inline void check_frames(struct sample_event *e, struct task_struct *task)
{
	if (e->user_len <= 0)
		return;
	__u32 frames = (__u32)e->user_len / sizeof(__u64);
	if (frames > MAX_USER_DEPTH)
		frames = MAX_USER_DEPTH;
	struct arch_regs regs;
	if (bpf_probe_read_kernel(&regs, sizeof(regs), (void *)bpf_task_pt_regs(task)))
		return;
	struct frame_check c = {.e = e, .sp = ARCH_SP(&regs), .frames = frames, .keep = frames};
	struct mm_struct *mm = task->mm;
	if (!mm)
		return;
	/* Up to the end of the environment: the vDSO may follow the stack closely on some
	 * kernels. A thread of its own has its stack among the mappings, where only the other
	 * checks hold. */
	c.stack_top = mm->env_end;
	if (c.sp > c.stack_top || c.stack_top - c.sp > MAIN_STACK_SPAN)
		c.sp = c.stack_top;
	c.task_size = mm->task_size;
	if (!c.task_size)
		return;
	bpf_loop(MAX_VMA_CHECKS, frame_check_step, &c, 0);
	if (c.keep < frames) {
		e->user_len = c.keep * sizeof(__u64);
		if (e->unwind_end == UNWIND_COMPLETE_FP || e->unwind_end == UNWIND_TRUNCATED)
			e->unwind_end = UNWIND_FP_BROKEN;
	}
}

/* hint_leaf names the leaf's mapping, in a record ahead of the sample, for a sample of an
 * image user space has not described to the kernel yet, so that the leaf resolves even if
 * the program is gone before it is read. One lookup only: from the timer interrupt,
 * bpf_find_vma releases the mmap lock by irq_work, and a second lookup finds that work
 * still pending until the program returns. */
static __always_inline void hint_leaf(struct sample_event *e, struct task_struct *task)
{
	__u32 zero = 0;
	struct vma_event *v = bpf_map_lookup_elem(&vma_scratch, &zero);
	if (!v || e->user_len <= 0)
		return;
	struct vma_found f = {};
	if (bpf_find_vma(task, e->frames[0], on_vma, &f, 0) || !f.exec || !f.inode)
		return;
	v->kind = EVENT_VMAS;
	v->pid = e->pid;
	v->exec_id = e->exec_id;
	v->ktime_ns = e->ktime_ns;
	v->cpu = e->cpu;
	v->count = 1;
	v->hints[0].start = f.start;
	v->hints[0].end = f.end;
	v->hints[0].offset = f.pgoff << PAGE_SHIFT;
	v->hints[0].inode = f.inode;
	v->hints[0].dev = f.dev;
	v->hints[0].pad = 0;
	bpf_ringbuf_output(&events, v, __builtin_offsetof(struct vma_event, hints) + sizeof(struct vma_hint), BPF_RB_NO_WAKEUP);
}

/* fill_sample records the current thread and its user and kernel stacks in e and returns
 * the record's size. known says whether user space had described the process to the kernel
 * (see unwind_user); hints, whether a process it had not may have its leaf's mapping named;
 * kernel, whether its kernel stack is wanted; kernel_skip, how many kernel frames at the
 * leaf are the caller's own, not the thread's. */
static __always_inline __u64 fill_sample(void *ctx, struct sample_event *e, __u64 id, int *known, int hints, int kernel, __u64 kernel_skip)
{
	__u32 tgid = id >> 32;
	struct task_struct *task = bpf_get_current_task_btf();
	e->pid = tgid;
	e->tid = (__u32)id;
	e->cpu = bpf_get_smp_processor_id();
	e->ktime_ns = bpf_ktime_get_ns();
	e->exec_id = task->self_exec_id;
	bpf_get_current_comm(e->comm, sizeof(e->comm));

	*known = 1;
	if (table_unwinding && ARCH_TABLE_UNWIND) {
		*known = unwind_user(e, task, tgid);
		if (hints && vma_hints && !*known) {
			check_frames(e, task);
			hint_leaf(e, task);
		}
		__u32 end = e->unwind_end < UNWIND_END_MAX ? e->unwind_end : UNWIND_INVALID;
		count(COUNTER_UNWIND_BASE + end);
	} else {
		/* User registers come from the task, so this works when the tick lands in the kernel too. */
		e->user_len = bpf_get_stack(ctx, e->frames, MAX_USER_DEPTH * sizeof(__u64), BPF_F_USER_STACK);
		/* bpf_get_stack does not say why its frame-pointer walk stopped: the sample says
		 * frame pointer, and no outcome is counted. */
		e->unwind_end = UNWIND_COMPLETE_FP;
		if (e->user_len < 0)
			count(COUNTER_USER_STACK_ERR);
	}
	__u32 user_frames = e->user_len > 0 ? (__u32)e->user_len / sizeof(__u64) : 0;
	if (user_frames > MAX_USER_DEPTH)
		user_frames = MAX_USER_DEPTH;
	e->kernel_len = 0;
	if (collect_kernel && kernel) {
		e->kernel_len = bpf_get_stack(ctx, &e->frames[user_frames], MAX_STACK_DEPTH * sizeof(__u64), kernel_skip & BPF_F_SKIP_FIELD_MASK);
		if (e->kernel_len < 0)
			count(COUNTER_KERNEL_STACK_ERR);
	}
	__u32 kernel_frames = e->kernel_len > 0 ? (__u32)e->kernel_len / sizeof(__u64) : 0;
	if (kernel_frames > MAX_STACK_DEPTH)
		kernel_frames = MAX_STACK_DEPTH;
	__u64 size = __builtin_offsetof(struct sample_event, frames) + (user_frames + kernel_frames) * sizeof(__u64);
	if (size > sizeof(*e))
		size = sizeof(*e);
	return size;
}

SEC("perf_event")
int sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	__u32 zero = 0;

	/* The idle task is not work anyone can act on. */
	if (tgid == 0 || !wanted(tgid))
		return 0;

	struct sample_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	e->kind = EVENT_SAMPLE;
	int known = 1;
	__u64 size = fill_sample(ctx, e, id, &known, 1, 1, 0);
	tracectx_emit(tgid, e->exec_id, e->cpu, e->ktime_ns); /* its record goes first */
	/* Waking the reader for every sample costs more than the sample; it polls instead, and
	 * is woken when the ring starts to fill, or when a process it does not know yet runs:
	 * read at once, the mappings of a short-lived process are still there. */
	__u64 flags = BPF_RB_NO_WAKEUP;
	if (!known || bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > ring_wakeup_bytes)
		flags = BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_output(&events, e, size, flags)) {
		count(COUNTER_RINGBUF_FULL);
		return 0;
	}
	count(COUNTER_SAMPLES);
	return 0;
}

#include "offcpu.h"

/* Flavours of the kernel's structs (CO-RE drops the ___ suffix): only what is read here. */
struct signal_struct___follow {
	struct {
		int counter;
	} live; /* atomic_t: the thread group's threads not yet exiting */
} __attribute__((preserve_access_index));

struct task_struct___follow {
	int tgid;
	struct signal_struct___follow *signal;
} __attribute__((preserve_access_index));

/* do_exit counts signal->live down before sched_process_exit: at 0 the whole thread group
 * is gone. The leader thread (pid == tgid) is no test: it dies first when another thread
 * execs and takes over its PID, and may exit before the other threads anyway. */
static __always_inline int thread_group_dead(void)
{
	struct task_struct___follow *task = (void *)bpf_get_current_task_btf();
	return task->signal->live.counter == 0;
}

/* Process events wait for the reader's next poll rather than waking it (host-wide). */
const volatile __u8 lazy_process_events = 0;

static __always_inline int emit_process_event(__u32 kind)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (kind == EVENT_EXIT && !thread_group_dead())
		return 0;
	if (!wanted(tgid))
		return 0;
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 exec_id = task->self_exec_id;
	/* The old image's mappings are wrong from here on, whatever user space has queued. */
	bpf_map_delete_elem(&proc_maps, &tgid);
	tracectx_forget(tgid);
	interp_forget(tgid);
	if (kind == EVENT_EXEC)
		bpf_map_update_elem(&exec_ids, &tgid, &exec_id, BPF_ANY);
	else
		bpf_map_delete_elem(&exec_ids, &tgid);
	struct process_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(COUNTER_RINGBUF_FULL);
		return 0;
	}
	e->kind = kind;
	e->pid = tgid;
	e->ktime_ns = bpf_ktime_get_ns();
	e->exec_id = exec_id;
	/* An exec's mappings are read best while the new image still runs: wake the reader now,
	 * unless user space reads a process only after a grace (host-wide): then its next poll
	 * takes the events, and an exec storm costs no wake-up per process. */
	__u64 flags = kind == EVENT_EXEC ? BPF_RB_FORCE_WAKEUP : 0;
	if (lazy_process_events)
		flags = BPF_RB_NO_WAKEUP;
	bpf_ringbuf_submit(e, flags);
	count(COUNTER_PROCESS_EVENTS);
	return 0;
}

/* sonde record follows a command's children: a process a target forks becomes a target
 * before its first instruction (on_fork), and leaves the filter when it exits, so that
 * target_pids holds the live ones and a reused PID is no one's target. */
const volatile __u8 follow_forks = 0;

static __always_inline void forget_followed(void)
{
	if (!follow_forks)
		return;
	if (!thread_group_dead())
		return;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	bpf_map_delete_elem(&target_pids, &tgid);
}

/* Raw tracepoints need neither tracefs nor the tracepoint's arguments: current is the process. */
SEC("raw_tracepoint/sched_process_exec")
int on_exec(void *ctx)
{
	return emit_process_event(EVENT_EXEC);
}

SEC("raw_tracepoint/sched_process_exit")
int on_exit(void *ctx)
{
	emit_process_event(EVENT_EXIT);
	forget_followed(); /* after the event, which only a target's exit sends */
	offcpu_exit();
	return 0;
}

/* Attached only with follow_forks. sched_process_fork fires in the forking task: current
 * is the parent, args[1] the child. */
SEC("raw_tracepoint/sched_process_fork")
int on_fork(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 parent = bpf_get_current_pid_tgid() >> 32;

	if (!follow_forks || !bpf_map_lookup_elem(&target_pids, &parent))
		return 0;
	struct task_struct___follow *child = (void *)ctx->args[1];
	int tgid = 0;
	/* A new thread of a target needs nothing: its thread group is a target already. */
	if (bpf_probe_read_kernel(&tgid, sizeof(tgid), &child->tgid) || (__u32)tgid == parent)
		return 0;
	__u32 key = tgid;
	__u8 one = 1;
	/* With the map full (bpf.MaxFollowed live targets) the child is not followed. */
	bpf_map_update_elem(&target_pids, &key, &one, BPF_NOEXIST);
	return 0;
}
