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

/* How the walk of a CPython thread's frames ended (python.h). */
enum py_end {
	PY_COMPLETE = 0,  /* every eval-loop activation got its frames */
	PY_NO_THREAD = 1, /* no thread state of the interpreter belongs to the sampled thread */
	PY_BAD_READ = 2,  /* reading the interpreter's memory failed */
	PY_TRUNCATED = 3, /* MAX_USER_DEPTH frames and Python frames left */
	PY_INVALID = 4,   /* a frame the walk cannot follow: a misaligned code object, a loop */
	PY_END_MAX,
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
	/* Then one per enum py_end: how the Python walks of samples in eval loops ended. */
	COUNTER_PYTHON_BASE = COUNTER_UNWIND_BASE + UNWIND_END_MAX,
	COUNTER_MAX = COUNTER_PYTHON_BASE + PY_END_MAX,
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

/* A CPython frame in the user frames of a sample: bits 63-62 hold 01, which no user or
 * kernel address has; then the code object's address >> PY_CODE_ALIGN_SHIFT (objects are
 * 16-byte aligned and user addresses below 2^47: 43 bits); then the instruction's offset in
 * the code object's bytecode, in 2-byte code units, saturated at PY_OFFSET_MASK. */
enum py_frame_encoding {
	PY_FRAME_TAG_SHIFT = 62,
	PY_FRAME_TAG = 1,
	PY_CODE_ALIGN_SHIFT = 4,
	PY_OFFSET_BITS = 19,
	PY_OFFSET_MASK = (1 << 19) - 1,
};

enum py_limits {
	PY_NO_OFFSET = 0xffff,     /* a py_proc offset the version does not have */
	PY_MAX_FRAME_READ = 128,   /* py_proc.frame_size at most */
	PY_MAX_THREADS = 512,      /* thread states searched for the sampled thread's */
	PY_MAX_FRAMES = 192,       /* Python frames walked per sample, shim frames included */
};

/* How an interpreter version lays out its frames and ties them to eval-loop activations. */
enum py_frame_model {
	PY_MODEL_NONE = 0,
	PY_MODEL_FRAME_OBJECT = 1, /* 3.9, 3.10: PyFrameObject, one per activation; f_lasti an int */
	PY_MODEL_ENTRY_FLAG = 2,   /* 3.11: _PyInterpreterFrame; an activation ends at is_entry */
	PY_MODEL_SHIM_FRAME = 3,   /* 3.12+: an activation ends at a frame owned by the C stack */
	PY_MODEL_MAX,
};

/* Where a CPython process keeps what its threads run, and how to read it: offsets from
 * the interpreter's own _Py_DebugOffsets, its debug info or sonde's table. Addresses are
 * the process's. */
struct py_proc {
	__u64 exec_id;                /* the exec the addresses belong to; 0: unknown */
	__u64 runtime;                /* &_PyRuntime */
	__u64 eval_start, eval_end;   /* _PyEval_EvalFrameDefault */
	__u64 cold_start, cold_end;   /* its .cold part split out by the compiler, or 0, 0 */
	__u64 skip_code;              /* a shim's code object, whose frames are not shown; 0: none known */
	__u32 model;                  /* enum py_frame_model */
	__u16 interp_head;            /* _PyRuntime: interpreters.head */
	__u16 threads_head;           /* PyInterpreterState: the first thread state */
	__u16 tstate_next;            /* PyThreadState: next */
	__u16 tstate_thread_id;       /* PyThreadState: thread_id, the thread's pthread_t */
	__u16 tstate_frame;           /* PyThreadState: frame, cframe or current_frame */
	__u16 cframe_frame;           /* _PyCFrame: current_frame; PY_NO_OFFSET without a cframe */
	__u16 frame_previous;         /* f_back or previous */
	__u16 frame_code;             /* f_code or f_executable */
	__u16 frame_instr;            /* f_lasti, prev_instr or instr_ptr */
	__u16 frame_owner;            /* owner; PY_NO_OFFSET before 3.11 */
	__u16 frame_is_entry;         /* is_entry (3.11); PY_NO_OFFSET otherwise */
	__u16 frame_size;             /* bytes read of a frame: past every offset above */
	__u16 code_adaptive;          /* PyCodeObject: co_code_adaptive (3.11+) */
	__u16 lasti_bytes;            /* 1: f_lasti counts bytes (3.9), 0: code units (3.10) */
};

/* exec and exit of a thread group, so user space can drop stale mappings at once. */
struct process_event {
	__u32 kind; /* EVENT_EXEC or EVENT_EXIT */
	__u32 pid;
	__u64 ktime_ns;
	__u64 exec_id; /* after an exec, the task's new self_exec_id */
};

#endif
