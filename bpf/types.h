/* Types shared by the kernel programs and the Go loader. Every struct here crosses the
 * kernel boundary and is exported to Go by bpf2go -type, never copied by hand. Every enum
 * ends in a _MAX sentinel: the sizes of the counters map and of Go's arrays derive from it. */
#ifndef SONDE_TYPES_H
#define SONDE_TYPES_H

/* bpf_get_stack's own ceiling (sysctl kernel.perf_event_max_stack defaults to 127). */
#define MAX_STACK_DEPTH 127
/* The user-space unwinder walks up to this many frames. */
#define MAX_USER_DEPTH 256
/* Executable mappings the unwinder knows per process; the rest fall back to frame pointers. */
#define MAX_PROC_MAPPINGS 256
/* How deep below the root a target cgroup may be: kubepods nest pods three or four deep. */
#define MAX_CGROUP_LEVELS 12

enum event_kind {
	EVENT_SAMPLE = 1,
	EVENT_EXEC = 2,
	EVENT_EXIT = 3,
	EVENT_CONTEXT = 4, /* struct tracectx_event: the trace context of the sample that follows */
	EVENT_VMAS = 5,    /* struct vma_event: where the frames of the sample that follows lie */
	EVENT_OFFCPU = 6,  /* struct sample_event: the stacks of a thread as it went off the CPU */
	EVENT_OFFCPU_END = 7, /* struct offcpu_end_event: it came back after a long enough wait */
	EVENT_GOPARK = 8,     /* struct sample_event: the stack of a goroutine as it parked */
	EVENT_GOPARK_END = 9, /* struct offcpu_end_event: it ran again after a long enough wait */
	EVENT_KIND_MAX,
};

/* How a user-stack walk ended: the first four are no failure; each failure has its own
 * value, so that the counters say what to fix. */
enum unwind_end {
	UNWIND_COMPLETE = 0,       /* reached the outermost frame, every frame by its unwind table */
	UNWIND_COMPLETE_FP = 1,    /* reached the outermost frame; code without a table by frame pointer */
	UNWIND_TRUNCATED = 2,      /* MAX_USER_DEPTH frames and still going */
	UNWIND_NO_USER = 3,        /* a kernel thread: no user stack */
	UNWIND_FP_BROKEN = 4,      /* code without a table, and its frame pointer led nowhere readable */
	UNWIND_BAD_READ = 5,       /* a table's rule named memory that could not be read */
	UNWIND_NO_ROW = 6,         /* the address lies in a file with a table, outside every function it describes */
	UNWIND_CFA_EXPRESSION = 7, /* a CFA expression the walker does not evaluate */
	UNWIND_REGISTER = 8,       /* a rule needs a register this frame does not know (only the interrupted frame knows them all) */
	UNWIND_RA_RULE = 9,        /* the return address is not saved at CFA-8 */
	UNWIND_NOT_ABOVE = 10,     /* the caller's frame does not lie above its callee's */
	UNWIND_TABLE_GONE = 11,    /* the file's table was removed from the kernel */
	UNWIND_GO_SWITCH = 12,     /* a Go stack switch could not be followed: g, m or saved registers unreadable */
	UNWIND_INVALID = 13,       /* a rule the walker does not know */
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
	/* Off-CPU (on_switch): threads going off the CPU to wait, those whose stacks were
	 * walked (all, or a sample of them when they come too fast), waits reported, waits
	 * shorter than the minimum, and records lost for want of room in the ring. */
	COUNTER_OFFCPU_SWITCHES = COUNTER_UNWIND_BASE + UNWIND_END_MAX,
	COUNTER_OFFCPU_WALKED,
	COUNTER_OFFCPU_SAMPLES,
	COUNTER_OFFCPU_SHORT,
	COUNTER_OFFCPU_LOST,
	COUNTER_OFFCPU_STALE, /* waits of threads that exited without their return seen */
	COUNTER_GOPARKS,        /* goroutines that parked, of the processes profiled */
	COUNTER_GOPARKS_WALKED, /* of which had their stacks walked and sent */
	COUNTER_GOPARK_SAMPLES, /* waits of at least the minimum, reported */
	COUNTER_MAX,
};

/* How the canonical frame address of a row is found; package unwind documents each rule. */
enum cfa_rule {
	CFA_INVALID = 0,
	CFA_SP = 1,
	CFA_FP = 2,
	CFA_PLT = 3,
	CFA_SIGNAL = 4,
	CFA_END_OF_STACK = 5,
	CFA_REG = 6,
	CFA_DEREF = 7,
	CFA_FRAME_POINTER = 8,
	CFA_GO = 9,
	CFA_EXPRESSION = 10,
	CFA_RA_ELSEWHERE = 11,
	CFA_RULE_MAX,
};

/* Where the caller's frame pointer was saved. */
enum fp_rule {
	FP_UNCHANGED = 0,
	FP_AT_CFA = 1,
	FP_INVALID = 2,
	FP_AT_FP = 3,
	FP_AT_SP = 4,
	FP_RULE_MAX,
};

/* What a Go runtime function does to a stack walk, as a CFA_GO row's cfa_reg says. */
enum go_func {
	GO_FUNC_NONE = 0,
	GO_FUNC_TOP = 1,         /* goexit, mstart, rt0_go, mcall: the outermost frame of a goroutine or thread */
	GO_FUNC_SYSTEMSTACK = 2, /* fn runs on g0; its caller's frame is where curg.sched.sp points */
	GO_FUNC_MORESTACK = 3,   /* newstack runs on g0 for curg, stopped in a prologue at curg.sched.pc */
	GO_FUNC_ASMCGOCALL = 4,  /* C code runs on g0; asmcgocall left g and the goroutine's stack depth there */
	GO_FUNC_FP_SWITCH = 5,   /* its frame is on one stack, its callee on another: cgocallback (g0, then curg), time.now and nanotime1 (curg, calling the vDSO on g0) */
	GO_FUNC_MAX,
};

/* One row of an unwind table: governs ELF virtual addresses from pc up to the next row.
 * 16 bytes, which is what the kernel's arrays take for the 12 bytes of the other fields. */
struct unwind_row {
	__u32 pc;
	__s32 cfa_offset;
	__s16 fp_offset;
	__u8 cfa_rule;
	__u8 fp_rule;
	__u8 cfa_reg;   /* CFA_REG, CFA_DEREF: the base register's DWARF number; CFA_GO: enum go_func */
	__u8 cfa_index; /* CFA_DEREF: 0, or CFA_INDEX | scale << 4 | register: add register << scale first */
	__s16 cfa_post; /* CFA_DEREF: added after the dereference */
};

#define CFA_INDEX 0x80

/* A large table carries, past its rows (exec_mapping.rows_count of them), an index by
 * page of code: this header, then for each page the first row of its search, four to a
 * 16-byte slot. A search then spans the few rows of one page, not the whole table: node's
 * 550 000 rows took 20 steps a frame, most of them cache misses. A table without one (no
 * slot past its rows, or pages 0) is searched whole. */
struct row_index {
	__u32 first_page; /* the first row's pc >> shift */
	__u32 pages;      /* pages indexed, from first_page; pages + 1 entries follow */
	__u32 shift;      /* a page is 1 << shift bytes of ELF virtual addresses */
	__u32 pad;
};

/* For bpf2go -type. */
const struct row_index *unused_row_index __attribute__((unused));

/* Where a Go binary's runtime keeps what its stack switches need; one per file, by table id. */
struct go_runtime {
	__s32 tls_g;     /* the running g is at the thread pointer (fsbase) + tls_g */
	__u16 g_m;       /* offsetof(g, m) */
	__u16 g_sched;   /* offsetof(g, sched) */
	__u16 m_curg;    /* offsetof(m, curg) */
	__u16 g_status;  /* offsetof(g, atomicstatus) */
	__u8 gobuf_sp;   /* offsetof(gobuf, sp) */
	__u8 gobuf_pc;
	__u8 gobuf_bp;
	__u8 g_stack_hi; /* offsetof(g, stack.hi) */
	__u8 cgo_depth;  /* where asmcgocall keeps the goroutine's stack depth, from its SP at the call */
	__u8 cgo_g;      /* and the goroutine */
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
	/* Which writing of the mappings this is: user space numbers each, never 0 and never
	 * the same twice, so that what was found in them is known to still hold (row_memo). */
	__u32 gen;
	struct exec_mapping maps[MAX_PROC_MAPPINGS];
};

/* What the walker last found for a frame's pc on this CPU: its mapping's row and table,
 * or that no table covers it, as found in one writing of the process's mappings (gen). Most
 * samples of a busy program repeat frames earlier samples walked, and a search of a large
 * table (node's 550 000 rows) touches pages that have left the caches and the TLB since.
 * Four ways a set, by pc, the entry of a set used least lately making room: in a memo
 * mapped directly by pc, two of a stack's two dozen frames often share a slot (node 20's
 * _start and v8::Function::Call did), and then each evicts the other at every sample; and
 * a frame seen once (a leaf in compiled code, whose pc varies) must not push out the frames
 * every sample shows. */
#define ROW_MEMO_WAYS 4
#define ROW_MEMO_SETS 64
#define ROW_MEMO_SLOTS (ROW_MEMO_WAYS * ROW_MEMO_SETS)

enum row_memo_kind {
	ROW_MEMO_EMPTY = 0,
	ROW_MEMO_ROW = 1,      /* row and table_id hold */
	ROW_MEMO_NO_TABLE = 2, /* no mapping with a table covers the pc */
};

struct row_memo_slot {
	__u64 pc;
	__u32 gen;
	__u32 table_id;
	struct unwind_row row;
	__u8 kind;  /* enum row_memo_kind */
	__u8 exact; /* pc was looked up as itself, not as a return address */
	__u8 pad[2];
	__u32 used; /* the memo's clock when last found or written; 0: never */
};

struct row_memo {
	struct row_memo_slot slot[ROW_MEMO_SLOTS];
	/* Counts lookups, for the slots' used. Where it wraps, after billions of lookups,
	 * entries used lately look old for a while: a few misses, no wrong row. */
	__u32 clock;
	__u32 pad;
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

/* A language runtime's frame among a sample's user frames (interpreted code, or code its
 * JIT compiled): bits 63-62 hold 01, which no canonical user or kernel address has; bits
 * 61-58 the runtime, as its walker's header numbers it (1 to INTERP_RUNTIME_MAX); the
 * other 58 bits are the runtime's own: which code and where in it, packed as its header
 * says and decoded only by its package in user space. */
enum interp_frame_encoding {
	INTERP_FRAME_TAG_SHIFT = 62,
	INTERP_FRAME_TAG = 1,
	INTERP_RUNTIME_SHIFT = 58,
	INTERP_RUNTIME_MAX = 15,
	INTERP_PAYLOAD_BITS = 58,
};

#define INTERP_FRAME(runtime, payload)                                                                   \
	((__u64)INTERP_FRAME_TAG << INTERP_FRAME_TAG_SHIFT | (__u64)(runtime) << INTERP_RUNTIME_SHIFT | \
	 ((__u64)(payload) & ((1ULL << INTERP_PAYLOAD_BITS) - 1)))

/* Code regions of a process that belong to a language runtime: an interpreter's eval loop,
 * a JIT's code cache. A native frame in one hands the sample over to that runtime's
 * walker. Written by user space per tgid for each runtime it finds in the process. */
#define MAX_INTERP_REGIONS 8

struct interp_region {
	__u64 start, end; /* [start, end) */
	__u32 runtime;    /* the runtime's number, as in its frames */
	__u32 pad;
};

struct interp_proc {
	__u64 exec_id;  /* the exec the regions belong to; 0: unknown */
	__u32 runtimes; /* a bit per runtime of the process, 1 << its number */
	__u32 count;    /* regions in use */
	struct interp_region regions[MAX_INTERP_REGIONS];
};

/* A thread off the CPU whose stacks were sent (EVENT_OFFCPU), by thread id, until it runs
 * again. */
struct offcpu_start {
	__u64 start_ns; /* CLOCK_MONOTONIC at the switch-out: the EVENT_OFFCPU record's ktime_ns */
	__u32 scale;    /* 256 times the switch-outs each walked one stands for */
	__u32 pid;
};

/* A parked goroutine whose stack was sent (EVENT_GOPARK), by its g and process, until the
 * scheduler runs it again. */
struct go_park_key {
	__u64 g;
	__u32 pid;
	__u32 pad;
};

struct go_park {
	__u64 start_ns; /* the EVENT_GOPARK record's ktime_ns */
	__u64 exec_id;  /* of the process as it parked: a PID reused finds no wait of the old one */
	__u32 scale;
	__u32 tid; /* the thread it parked on: the EVENT_GOPARK record's */
};

/* A thread back on the CPU after a wait of at least the minimum: pairs with the
 * EVENT_OFFCPU record of tid whose ktime_ns is start_ns. EVENT_GOPARK_END: a goroutine
 * run again, pairing with the EVENT_GOPARK record of tid and start_ns. */
struct offcpu_end_event {
	__u32 kind; /* EVENT_OFFCPU_END */
	__u32 pid;
	__u32 tid;
	__u32 cpu;
	__u64 start_ns;
	__u64 end_ns;
	__u64 weight_ns; /* end_ns - start_ns times the walk's scale */
};

/* exec and exit of a thread group, so user space can drop stale mappings at once. */
struct process_event {
	__u32 kind; /* EVENT_EXEC or EVENT_EXIT */
	__u32 pid;
	__u64 ktime_ns;
	__u64 exec_id; /* after an exec, the task's new self_exec_id */
};

enum vma_limits {
	MAX_VMA_HINTS = 1,   /* mappings a vma_event names: the leaf's (sampler.bpf.c says why) */
	MAX_VMA_CHECKS = 32, /* frames of a frame-pointer walk checked to be return addresses */
};

/* An executable mapping a sampled frame lies in, as the kernel had it at the sample: named
 * for samples of an image user space has not read yet (a process that lives a few
 * milliseconds may be gone before it is read), so that its frames resolve to the file all
 * the same. */
struct vma_hint {
	__u64 start;
	__u64 end;
	__u64 offset; /* the file offset start maps */
	__u64 inode;  /* 0: no file */
	__u32 dev;    /* the file's device, in the kernel's encoding: major << 20 | minor */
	__u32 pad;
};

struct vma_event {
	__u32 kind; /* EVENT_VMAS */
	__u32 pid;
	__u64 exec_id;
	__u64 ktime_ns; /* the sample's, with cpu: which sample the record goes with */
	__u32 cpu;
	__u32 count;
	struct vma_hint hints[MAX_VMA_HINTS];
};

/* What a sampled thread published about the work it is doing (tracectx.h): OpenTelemetry's
 * thread context record (OTEP 4947) or a Go goroutine's pprof labels. */

/* Bytes of context one sample carries: OTEP 4947 recommends whole records of at most 640
 * bytes, its 28-byte header included; a larger record is counted and ignored. Go labels
 * are packed into as much. The buffer behind it has room for one more label past that, so
 * that the verifier sees every copy in bounds before the running total is checked. */
#define TRACECTX_DATA_MAX 640
#define TRACECTX_DATA_BUF 1024
#define OTEL_RECORD_HEADER 28
/* Go labels: at most this many per sample, keys and values cut at these lengths. */
#define GO_LABELS_MAX 16
#define GO_LABEL_KEY_MAX 64
#define GO_LABEL_VALUE_MAX 128

enum ctx_source {
	CTX_NONE = 0,
	CTX_OTEL = 1,      /* data: the thread context record, header and attrs-data, as published */
	CTX_GO_LABELS = 2, /* data: per label, key length (u8), value length (u8), key, value */
	CTX_SOURCE_MAX,
};

/* Where a thread's otel_thread_ctx_v1 is. */
enum tls_model {
	TLS_NONE = 0,   /* no OpenTelemetry thread context to read */
	TLS_STATIC = 1, /* at thread pointer + tls_offset: the executable's, or a library's in static TLS */
	TLS_DTV = 2,    /* at dtv[tls_module] + tls_offset: a library's in dynamic TLS */
	TLS_MODEL_MAX,
};

/* How a Go runtime keeps a goroutine's pprof labels behind g.labels. */
enum go_labels_layout {
	GO_LABELS_NONE = 0,  /* not a Go program, or one whose runtime sonde cannot read */
	GO_LABELS_SLICE = 1, /* Go 1.24 on: a pointer to a sorted []struct{key, value string} */
	GO_LABELS_MAP = 2,   /* before: a pointer to a map[string]string */
	GO_LABELS_LAYOUT_MAX,
};

/* What the kernel needs to read a process's trace context, written by user space per tgid
 * as it reads the process. A process that publishes nothing has no entry. */
struct tracectx_proc {
	__u64 exec_id;    /* the exec this was read for; 0: any */
	__s64 tls_offset; /* TLS_STATIC: from the thread pointer; TLS_DTV: into the module's block */
	__u64 tls_module; /* TLS_DTV: the module id */
	__s32 dtv_offset; /* TLS_DTV: the DTV pointer is at thread pointer + dtv_offset */
	__s32 dtv_len;    /* TLS_DTV: the DTV's length is its entry dtv_len (glibc: -1); 0: unchecked */
	__u8 tls_model;   /* enum tls_model */
	__u8 dtv_shift;   /* TLS_DTV: entries are 1 << dtv_shift bytes (glibc 16, musl 8) */
	__u8 go_layout;   /* enum go_labels_layout */
	__u8 pad;
	/* Go: the running g at thread pointer + go_g_offset; its m, the m's curg and the
	 * curg's labels at these offsets. */
	__s32 go_g_offset;
	__u32 go_g_m;
	__u32 go_m_curg;
	__u32 go_g_labels;
	__u32 pad2;
};

/* The trace context of one sample, sent just before the sample it belongs to. */
struct tracectx_event {
	__u32 kind; /* EVENT_CONTEXT */
	__u32 cpu;
	__u64 ktime_ns; /* the sample's: with cpu, it names the sample */
	__u32 source;   /* enum ctx_source */
	__u32 len;      /* bytes of data */
	__u8 data[TRACECTX_DATA_BUF];
};

/* Indices of the per-CPU tracectx_counters map. */
enum tracectx_counter {
	TRACECTX_OTEL = 0,         /* thread context records read */
	TRACECTX_GO_LABELS = 1,    /* Go label sets read */
	TRACECTX_INVALID = 2,      /* records whose valid byte is not 1, or misaligned */
	TRACECTX_OVERSIZED = 3,    /* records over TRACECTX_DATA_MAX bytes: ignored */
	TRACECTX_TORN = 4,         /* records or label maps that changed while read: ignored */
	TRACECTX_READ_ERROR = 5,   /* reads of the process's memory that failed */
	TRACECTX_GO_TRUNCATED = 6, /* label sets cut to GO_LABELS_MAX, to the key or value bounds, or to the buffer */
	TRACECTX_STALE = 7,        /* samples of a process that exec'd since user space described it */
	TRACECTX_RINGBUF_FULL = 8, /* contexts lost for want of room in the ring */
	/* With tracectx_stats: samples that asked for a context, and the ns tracectx_emit took. */
	TRACECTX_CALLS = 9,
	TRACECTX_NS = 10,
	TRACECTX_COUNTER_MAX,
};

#endif
