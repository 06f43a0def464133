/* Types shared by the kernel programs and the Go loader. Every struct here crosses the
 * kernel boundary and is exported to Go by bpf2go -type, never copied by hand. */
#ifndef SONDE_TYPES_H
#define SONDE_TYPES_H

/* bpf_get_stack's own ceiling (sysctl kernel.perf_event_max_stack defaults to 127). */
#define MAX_STACK_DEPTH 127

enum event_kind {
	EVENT_SAMPLE = 1,
	EVENT_EXEC = 2,
	EVENT_EXIT = 3,
};

/* Indices of the per-CPU counters map. */
enum counter {
	COUNTER_SAMPLES = 0,
	COUNTER_RINGBUF_FULL = 1,
	COUNTER_USER_STACK_ERR = 2,
	COUNTER_KERNEL_STACK_ERR = 3,
	COUNTER_PROCESS_EVENTS = 4,
	COUNTER_MAX = 5,
};

struct sample_event {
	__u32 kind; /* EVENT_SAMPLE */
	__u32 pid;  /* thread group id */
	__u32 tid;
	__u32 cpu;
	__u64 ktime_ns; /* CLOCK_MONOTONIC */
	char comm[16];  /* the sampled thread's name */
	__s32 user_len; /* bytes written to user[], or a negative errno */
	__s32 kernel_len;
	__u64 user[MAX_STACK_DEPTH];
	__u64 kernel[MAX_STACK_DEPTH];
};

/* exec and exit of a thread group, so user space can drop stale mappings at once. */
struct process_event {
	__u32 kind; /* EVENT_EXEC or EVENT_EXIT */
	__u32 pid;
	__u64 ktime_ns;
};

#endif
