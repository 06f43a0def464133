/* Types shared by the kernel programs and the Go loader. Every struct here crosses the
 * kernel boundary and is exported to Go by bpf2go -type, never copied by hand. Every enum
 * ends in a _MAX sentinel: the sizes of the counters map and of Go's arrays derive from it. */
#ifndef SONDE_TYPES_H
#define SONDE_TYPES_H

/* bpf_get_stack's own ceiling (sysctl kernel.perf_event_max_stack defaults to 127). */
#define MAX_STACK_DEPTH 127
/* The user-space unwinder walks up to this many frames. */
#define MAX_USER_DEPTH 128
/* Executable mappings the unwinder knows per process; the rest fall back to frame pointers. */
#define MAX_PROC_MAPPINGS 256
/* How deep below the root a target cgroup may be: kubepods nest pods three or four deep. */
#define MAX_CGROUP_LEVELS 12

enum event_kind {
	EVENT_SAMPLE = 1,
	EVENT_EXEC = 2,
	EVENT_EXIT = 3,
	EVENT_KIND_MAX,
};

/* How a user-stack walk ended. */
enum unwind_end {
	UNWIND_COMPLETE = 0,  /* reached the outermost frame */
	UNWIND_TRUNCATED = 1, /* MAX_USER_DEPTH frames and still going */
	UNWIND_NO_TABLE = 2,  /* a frame had no unwind table; the frame-pointer fallback ended the walk */
	UNWIND_BAD_READ = 3,  /* reading the stack failed */
	UNWIND_INVALID = 4,   /* a table row the unwinder cannot follow, or a nonsense address */
	UNWIND_NO_USER = 5,   /* a kernel thread: no user stack */
	UNWIND_END_MAX,
};

/* Indices of the per-CPU counters map: the fixed counters, then one per enum unwind_end. */
enum counter {
	COUNTER_SAMPLES = 0,
	COUNTER_RINGBUF_FULL = 1,
	COUNTER_USER_STACK_ERR = 2,
	COUNTER_KERNEL_STACK_ERR = 3,
	COUNTER_PROCESS_EVENTS = 4,
	/* Samples of a process whose unwinder mappings belong to an earlier exec: walked by frame pointer. */
	COUNTER_STALE_MAPPINGS = 5,
	COUNTER_UNWIND_BASE = 6,
	COUNTER_MAX = COUNTER_UNWIND_BASE + UNWIND_END_MAX,
};

/* How the canonical frame address of a row is found; package unwind documents each rule. */
enum cfa_rule {
	CFA_INVALID = 0,
	CFA_SP = 1,
	CFA_FP = 2,
	CFA_PLT = 3,
	CFA_SIGNAL = 4,
	CFA_END_OF_STACK = 5,
	CFA_RULE_MAX,
};

/* Where the caller's frame pointer was saved. */
enum fp_rule {
	FP_UNCHANGED = 0,
	FP_AT_CFA = 1,
	FP_INVALID = 2,
	FP_RULE_MAX,
};

/* One row of an unwind table: governs ELF virtual addresses from pc up to the next row. */
struct unwind_row {
	__u32 pc;
	__s32 cfa_offset;
	__s16 fp_offset;
	__u8 cfa_rule;
	__u8 fp_rule;
};

/* An executable mapping of a process and the table of its file. */
struct exec_mapping {
	__u64 start;
	__u64 end;
	__u64 bias;       /* runtime address - ELF virtual address */
	__u32 table_id;   /* index into unwind_tables */
	__u32 rows_count; /* 0: no table, walk by frame pointer */
};

/* A process's executable mappings, sorted by start, as read after its exec exec_id. */
struct proc_info {
	__u64 exec_id; /* the task's self_exec_id when user space read the mappings */
	__u32 count;
	__u32 pad;
	struct exec_mapping maps[MAX_PROC_MAPPINGS];
};

struct sample_event {
	__u32 kind; /* EVENT_SAMPLE */
	__u32 pid;  /* thread group id */
	__u32 tid;
	__u32 cpu;
	__u64 ktime_ns; /* CLOCK_MONOTONIC */
	__u64 exec_id;  /* the task's self_exec_id: which exec of pid the addresses belong to */
	char comm[16];  /* the sampled thread's name */
	__s32 user_len; /* bytes written to user[], or a negative errno */
	__s32 kernel_len;
	__u32 unwind_end; /* enum unwind_end */
	__u32 pad;
	/* user_len bytes of user frames, then kernel_len bytes of kernel frames; the ring
	 * record ends there, so a shallow stack costs a short record. */
	__u64 frames[MAX_USER_DEPTH + MAX_STACK_DEPTH];
};

/* exec and exit of a thread group, so user space can drop stale mappings at once. */
struct process_event {
	__u32 kind; /* EVENT_EXEC or EVENT_EXIT */
	__u32 pid;
	__u64 ktime_ns;
	__u64 exec_id; /* after an exec, the task's new self_exec_id */
};

#endif
