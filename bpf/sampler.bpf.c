//go:build ignore

// SPDX-License-Identifier: GPL-2.0
/* sonde's sampler: on every cpu-clock tick, record who ran and their user and kernel stacks. */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>

/* Opaque: only passed from bpf_get_current_task_btf to bpf_task_pt_regs. */
struct task_struct;

#include "types.h"

char LICENSE[] SEC("license") = "GPL";

/* Load-time settings, rewritten by the loader before the verifier sees the program. */
const volatile __u8 filter_pids = 0;
const volatile __u8 collect_kernel = 1;
/* 0: user stacks by bpf_get_stack's frame-pointer walk only; 1: table-driven unwinding. */
const volatile __u8 unwind_tables = 1;
/* Wake the reader once this much waits in the ring (a quarter of it). */
const volatile __u64 ring_wakeup_bytes = 1 << 18;

/* tgids to sample when filter_pids is set; sized by the loader from --pid. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u8);
} target_pids SEC(".maps");

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

/* Unwind rows of every file sonde has a table for; files own contiguous ranges. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unwind_row);
} unwind_rows SEC(".maps");

/* Executable mappings per process (tgid), written by user space as it reads /proc. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct proc_info);
} proc_maps SEC(".maps");

/* The event is built here, off the 512-byte BPF stack, then copied to the ring. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sample_event);
} scratch SEC(".maps");

/* Force the enums into BTF so bpf2go can export them. */
const enum event_kind *unused_event_kind __attribute__((unused));
const enum counter *unused_counter __attribute__((unused));
const struct sample_event *unused_sample_event __attribute__((unused));
const struct unwind_row *unused_unwind_row __attribute__((unused));
const struct proc_info *unused_proc_info __attribute__((unused));
const enum unwind_end *unused_unwind_end __attribute__((unused));
const enum cfa_rule *unused_cfa_rule __attribute__((unused));
const enum fp_rule *unused_fp_rule __attribute__((unused));
const struct process_event *unused_process_event __attribute__((unused));

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);
	if (c)
		(*c)++;
}

static __always_inline int wanted(__u32 tgid)
{
	if (!filter_pids)
		return 1;
	return bpf_map_lookup_elem(&target_pids, &tgid) != NULL;
}

/* Offsets of rip, rsp and rbp in the ucontext a signal handler's frame holds (x86-64 glibc:
 * uc_mcontext.gregs starts at 40; REG_RIP=16, REG_RSP=15, REG_RBP=10). */
#define UCONTEXT_RIP 168
#define UCONTEXT_RSP 160
#define UCONTEXT_RBP 120

struct unwind_state {
	struct sample_event *e;
	struct proc_info *proc; /* looked up once per sample; NULL: walk by frame pointer */
	__u64 pc, sp, fp;
	__u32 pid;
	__u32 n;
	__u32 end;
	__u8 used_fp; /* a frame was walked by frame pointer for lack of a table */
	__u8 done;
	/* pc is the interrupted instruction, not a return address: the leaf, or the frame a
	 * signal interrupted. Return addresses are looked up one byte back, inside the call. */
	__u8 pc_exact;
};

static __always_inline int read_user(__u64 *dst, __u64 addr)
{
	return bpf_probe_read_user(dst, sizeof(*dst), (const void *)addr);
}

/* Binary searches run as bpf_loop callbacks: the verifier checks a callback once, where
 * an unrolled search is explored branch by branch and exceeds its instruction budget. */
struct search {
	__u64 key;
	struct proc_info *proc; /* find_mapping: whose mappings */
	__u32 lo, hi;
};

static long mapping_search_step(__u32 i, void *ctx)
{
	struct search *s = ctx;
	struct proc_info *proc = s->proc;
	if (s->lo >= s->hi || !proc)
		return 1;
	__u32 mid = s->lo + (s->hi - s->lo) / 2;
	if (proc->maps[mid & (MAX_PROC_MAPPINGS - 1)].start <= s->key)
		s->lo = mid + 1;
	else
		s->hi = mid;
	return 0;
}

/* find_mapping returns the mapping of proc covering pc. */
static __always_inline struct exec_mapping *find_mapping(struct proc_info *proc, __u64 pc)
{
	struct search s = {.key = pc, .proc = proc, .lo = 0, .hi = proc->count};
	if (s.hi > MAX_PROC_MAPPINGS)
		s.hi = MAX_PROC_MAPPINGS;
	bpf_loop(10, mapping_search_step, &s, 0); /* 2^9 > MAX_PROC_MAPPINGS */
	if (s.lo == 0 || s.lo > MAX_PROC_MAPPINGS)
		return NULL;
	struct exec_mapping *m = &proc->maps[(s.lo - 1) & (MAX_PROC_MAPPINGS - 1)];
	if (pc >= m->end || pc < m->start)
		return NULL;
	return m;
}

static long row_search_step(__u32 i, void *ctx)
{
	struct search *s = ctx;
	if (s->lo >= s->hi)
		return 1;
	__u32 mid = s->lo + (s->hi - s->lo) / 2;
	struct unwind_row *r = bpf_map_lookup_elem(&unwind_rows, &mid);
	if (!r)
		return 1;
	if (r->pc <= s->key)
		s->lo = mid + 1;
	else
		s->hi = mid;
	return 0;
}

/* find_row returns the last row of [first, first+count) whose pc <= vaddr. */
static __always_inline struct unwind_row *find_row(__u32 first, __u32 count, __u32 vaddr)
{
	struct search s = {.key = vaddr, .lo = first, .hi = first + count};
	bpf_loop(25, row_search_step, &s, 0); /* tables hold fewer than 2^24 rows */
	if (s.lo == first)
		return NULL;
	__u32 idx = s.lo - 1;
	return bpf_map_lookup_elem(&unwind_rows, &idx);
}

static __always_inline long finish(struct unwind_state *st, __u32 end)
{
	st->end = end;
	st->done = 1;
	return 1; /* stops bpf_loop */
}

/* step records the current frame and moves to its caller. */
static long unwind_step(__u32 i, void *ctx)
{
	struct unwind_state *st = ctx;
	struct sample_event *e = st->e;

	if (st->pc == 0)
		return finish(st, UNWIND_COMPLETE);
	if (st->n >= MAX_USER_DEPTH)
		return finish(st, UNWIND_TRUNCATED);
	e->frames[st->n & (MAX_USER_DEPTH - 1)] = st->pc;
	st->n++;

	struct unwind_row *row = NULL;
	struct proc_info *proc = st->proc;
	if (proc) {
		struct exec_mapping *m = find_mapping(proc, st->pc);
		if (m && m->rows_count) {
			/* A return address points after the call; the call itself belongs to the caller's row. */
			__u64 vaddr = st->pc - m->bias - (st->pc_exact ? 0 : 1);
			row = find_row(m->rows_first, m->rows_count, (__u32)vaddr);
			if (!row)
				return finish(st, UNWIND_INVALID);
		}
	}

	__u64 cfa, ra, fp = st->fp;
	if (!row) {
		/* No table: trust the frame pointer, as bpf_get_stack would. */
		st->used_fp = 1;
		if (st->fp == 0)
			return finish(st, UNWIND_NO_TABLE);
		if (read_user(&ra, st->fp + 8) || read_user(&fp, st->fp))
			return finish(st, UNWIND_NO_TABLE);
		cfa = st->fp + 16;
	} else {
		switch (row->cfa_rule) {
		case CFA_SP:
			cfa = st->sp + row->cfa_offset;
			break;
		case CFA_FP:
			cfa = st->fp + row->cfa_offset;
			break;
		case CFA_PLT:
			cfa = st->sp + 8 + ((st->pc & 15) >= 11 ? 8 : 0);
			break;
		case CFA_SIGNAL:
			if (read_user(&ra, st->sp + UCONTEXT_RIP) || read_user(&cfa, st->sp + UCONTEXT_RSP) ||
			    read_user(&fp, st->sp + UCONTEXT_RBP))
				return finish(st, UNWIND_BAD_READ);
			st->pc = ra;
			st->sp = cfa;
			st->fp = fp;
			st->pc_exact = 1;
			return 0;
		case CFA_END_OF_STACK:
			return finish(st, UNWIND_COMPLETE);
		default:
			return finish(st, UNWIND_INVALID);
		}
		if (read_user(&ra, cfa - 8))
			return finish(st, UNWIND_BAD_READ);
		if (row->fp_rule == FP_AT_CFA) {
			if (read_user(&fp, cfa + row->fp_offset))
				return finish(st, UNWIND_BAD_READ);
		} else if (row->fp_rule == FP_INVALID) {
			fp = 0;
		}
	}
	/* The stack grows down: a caller's frame lies above its callee's. */
	if (cfa <= st->sp && st->n > 1)
		return finish(st, UNWIND_INVALID);
	st->pc_exact = 0;
	st->pc = ra;
	st->sp = cfa;
	st->fp = fp;
	return 0;
}

/* unwind_user walks the user stack from the registers the task entered the kernel with. */
static __always_inline void unwind_user(struct sample_event *e, __u32 tgid)
{
	struct pt_regs regs;
	struct task_struct *task = bpf_get_current_task_btf();
	if (bpf_probe_read_kernel(&regs, sizeof(regs), (void *)bpf_task_pt_regs(task)) || (regs.cs & 3) != 3) {
		e->user_len = 0;
		e->unwind_end = UNWIND_NO_USER;
		return;
	}
	struct unwind_state st = {
		.e = e,
		.pc = regs.rip,
		.sp = regs.rsp,
		.fp = regs.rbp,
		.pid = tgid,
		.pc_exact = 1,
		.proc = bpf_map_lookup_elem(&proc_maps, &tgid),
	};
	bpf_loop(MAX_USER_DEPTH + 1, unwind_step, &st, 0);
	if (!st.done)
		st.end = UNWIND_TRUNCATED;
	else if (st.end == UNWIND_COMPLETE && st.used_fp)
		st.end = UNWIND_NO_TABLE;
	e->user_len = st.n * sizeof(__u64);
	e->unwind_end = st.end;
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
	e->pid = tgid;
	e->tid = (__u32)id;
	e->cpu = bpf_get_smp_processor_id();
	e->ktime_ns = bpf_ktime_get_ns();
	bpf_get_current_comm(e->comm, sizeof(e->comm));

	if (unwind_tables) {
		unwind_user(e, tgid);
		count(COUNTER_UNWIND_BASE + (e->unwind_end < 6 ? e->unwind_end : 4));
	} else {
		/* User registers come from the task, so this works when the tick lands in the kernel too. */
		e->user_len = bpf_get_stack(ctx, e->frames, MAX_USER_DEPTH * sizeof(__u64), BPF_F_USER_STACK);
		e->unwind_end = UNWIND_NO_TABLE;
		if (e->user_len < 0)
			count(COUNTER_USER_STACK_ERR);
	}
	__u32 user_frames = e->user_len > 0 ? (__u32)e->user_len / sizeof(__u64) : 0;
	if (user_frames > MAX_USER_DEPTH)
		user_frames = MAX_USER_DEPTH;
	e->kernel_len = 0;
	if (collect_kernel) {
		e->kernel_len = bpf_get_stack(ctx, &e->frames[user_frames], MAX_STACK_DEPTH * sizeof(__u64), 0);
		if (e->kernel_len < 0)
			count(COUNTER_KERNEL_STACK_ERR);
	}
	__u32 kernel_frames = e->kernel_len > 0 ? (__u32)e->kernel_len / sizeof(__u64) : 0;
	if (kernel_frames > MAX_STACK_DEPTH)
		kernel_frames = MAX_STACK_DEPTH;
	__u64 size = __builtin_offsetof(struct sample_event, frames) + (user_frames + kernel_frames) * sizeof(__u64);
	if (size > sizeof(*e))
		size = sizeof(*e);
	/* Waking the reader for every sample costs more than the sample; it polls instead,
	 * and is woken only when the ring starts to fill. */
	__u64 flags = BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > ring_wakeup_bytes)
		flags = BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_output(&events, e, size, flags)) {
		count(COUNTER_RINGBUF_FULL);
		return 0;
	}
	count(COUNTER_SAMPLES);
	return 0;
}

static __always_inline int emit_process_event(__u32 kind)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;

	/* A thread exiting is not its process exiting. */
	if (kind == EVENT_EXIT && tgid != (__u32)id)
		return 0;
	if (!wanted(tgid))
		return 0;
	struct process_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(COUNTER_RINGBUF_FULL);
		return 0;
	}
	e->kind = kind;
	e->pid = tgid;
	e->ktime_ns = bpf_ktime_get_ns();
	bpf_ringbuf_submit(e, 0);
	count(COUNTER_PROCESS_EVENTS);
	return 0;
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
	return emit_process_event(EVENT_EXIT);
}
