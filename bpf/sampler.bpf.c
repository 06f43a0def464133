//go:build ignore

// SPDX-License-Identifier: GPL-2.0
/* sonde's sampler: on every cpu-clock tick, record who ran and their user and kernel stacks. */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>

#include "types.h"

char LICENSE[] SEC("license") = "GPL";

/* Load-time settings, rewritten by the loader before the verifier sees the program. */
const volatile __u8 filter_pids = 0;
const volatile __u8 collect_kernel = 1;

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

/* Force the enums into BTF so bpf2go can export them. */
const enum event_kind *unused_event_kind __attribute__((unused));
const enum counter *unused_counter __attribute__((unused));
const struct sample_event *unused_sample_event __attribute__((unused));
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

SEC("perf_event")
int sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;

	/* The idle task is not work anyone can act on. */
	if (tgid == 0 || !wanted(tgid))
		return 0;

	struct sample_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(COUNTER_RINGBUF_FULL);
		return 0;
	}
	e->kind = EVENT_SAMPLE;
	e->pid = tgid;
	e->tid = (__u32)id;
	e->cpu = bpf_get_smp_processor_id();
	e->ktime_ns = bpf_ktime_get_ns();
	bpf_get_current_comm(e->comm, sizeof(e->comm));

	/* User registers come from the task, so this works when the tick lands in the kernel too. */
	e->user_len = bpf_get_stack(ctx, e->user, sizeof(e->user), BPF_F_USER_STACK);
	if (e->user_len < 0)
		count(COUNTER_USER_STACK_ERR);
	e->kernel_len = 0;
	if (collect_kernel) {
		e->kernel_len = bpf_get_stack(ctx, e->kernel, sizeof(e->kernel), 0);
		if (e->kernel_len < 0)
			count(COUNTER_KERNEL_STACK_ERR);
	}
	bpf_ringbuf_submit(e, 0);
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
