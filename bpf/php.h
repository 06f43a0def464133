/* PHP (Zend engine) frames, interleaved with the native frames the walker found.
 *
 * The Zend VM runs a PHP call without a native call: a user function calling another
 * pushes a zend_execute_data and goes on in the same execute_ex, so one activation of
 * execute_ex on the native stack runs a span of the executor's frames, innermost first, up
 * to and including the first user frame marked ZEND_CALL_TOP (the one execute_ex was
 * entered for: the script's body, or a callback zend_call_function runs). Internal
 * functions (usort, array_map) run as native code the VM calls; their frames sit in the
 * chain too and never end a span. php_frames replaces each activation's native frame by
 * its span, so a stack reads PHP, internal function, C, in the order they called.
 *
 * With opcache's JIT, compiled code runs in place of the VM's handlers: the hybrid VM jumps
 * into it from execute_ex, so it runs on execute_ex's native frame and keeps the same
 * executor frames. A pc in the JIT's buffer is such an activation, and the native walk
 * crosses it by execute_ex's frame layout (php_jit_frames, a JIT runtime's walker: see
 * runtimes.h).
 *
 * Everything it reads is the process's, which can lie: reads are checked, loops bounded by
 * PHP_MAX_FRAMES, and offsets masked into the scratch buffer. sampler.bpf.c includes it
 * after unwinder.h with the same helpers. */
#ifndef SONDE_PHP_H
#define SONDE_PHP_H

/* PHP's number among the runtimes (types.h, enum interp_frame_encoding), and how its 58
 * bits of a frame hold a function and a line in it: a kind bit, the address >>
 * PHP_FUNC_ALIGN_SHIFT (the engine's allocations are 8-byte aligned, user addresses below
 * 2^47: 44 bits), then the line of the frame's current opline, saturated at PHP_LINE_MASK
 * (0: none, an internal function's frame). The address is the zend_function's, or for a
 * script's body (PHP_KIND_SCRIPT) its file name's zend_string: opcache gives each request
 * a copy of a cached script's op array that the request frees at its end, while the name
 * stays in shared memory. */
enum php_frame_encoding {
	PHP_RUNTIME = 5,
	PHP_FUNC_ALIGN_SHIFT = 3,
	PHP_LINE_BITS = 13,
	PHP_LINE_MASK = (1 << 13) - 1,
	PHP_KIND_SCRIPT_BIT = 57,
};

/* How the walk of a PHP process's frames ended. */
enum php_end {
	PHP_COMPLETE = 0,  /* every execute_ex activation got its frames */
	PHP_NO_FRAME = 1,  /* the executor ran no frame (starting, compiling, shutting down) */
	PHP_BAD_READ = 2,  /* reading the engine's memory failed */
	PHP_TRUNCATED = 3, /* MAX_USER_DEPTH frames and PHP frames left */
	PHP_INVALID = 4,   /* a frame the walk cannot follow: a misaligned function, a loop */
	PHP_END_MAX,
};

enum php_limits {
	PHP_MAX_FRAME_READ = 64, /* bytes of a zend_execute_data read: past prev_execute_data */
	PHP_MAX_FRAMES = 192,    /* PHP frames walked per sample */
	PHP_CALL_TOP = 1 << 17,  /* ZEND_CALL_TOP in the frame's call info */
	PHP_INTERNAL_FUNCTION = 1,
};

/* Where a PHP process keeps its executor's frames, and how to read them: offsets from
 * sonde's table of the engine's layouts, checked against the binary. Addresses are the
 * process's. */
struct php_proc {
	__u64 exec_id;              /* the exec the addresses belong to; 0: unknown */
	__u64 current;              /* &executor_globals.current_execute_data */
	__u64 exec_start, exec_end; /* execute_ex */
	__u64 cold_start, cold_end; /* its part the compiler moved out of line, or 0, 0 */
	__u64 jit_start, jit_end;   /* opcache's JIT buffer, or 0, 0 */
	__u16 ex_opline;            /* zend_execute_data: opline */
	__u16 ex_func;              /* zend_execute_data: func */
	__u16 ex_call_info;         /* zend_execute_data: This.u1.type_info, the call info */
	__u16 ex_prev;              /* zend_execute_data: prev_execute_data */
	__u16 func_type;            /* zend_function: type */
	__u16 func_name;            /* zend_function: function_name; NULL for a script's body */
	__u16 op_array_filename;    /* zend_op_array: filename */
	__u16 op_lineno;            /* zend_op: lineno */
	__u16 jit_cfa;              /* execute_ex's CFA where its body runs, less sp or rbp */
	__u16 jit_fp;               /* where it saved rbp, below its CFA; 0: not saved */
	__u16 jit_from_fp;          /* 1: jit_cfa is from rbp (a frame pointer), 0: from sp */
	__u16 pad;
};

/* For bpf2go -type. */
const struct php_proc *unused_php_proc __attribute__((unused));
const enum php_end *unused_php_end __attribute__((unused));
const enum php_frame_encoding *unused_php_frame_encoding __attribute__((unused));
const enum php_limits *unused_php_limits __attribute__((unused));

/* Per-process engine state, written by user space (package interp/php) when it finds the
 * Zend engine mapped, deleted at exec and exit like proc_maps. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct php_proc);
} php_procs SEC(".maps");

struct php_scratch {
	struct state_walk st; /* in the per-CPU scratch map, not on the BPF stack (see python.h) */
	__u64 native[MAX_USER_DEPTH];
	__u8 ex[2 * PHP_MAX_FRAME_READ]; /* a frame's bytes; offsets are masked below PHP_MAX_FRAME_READ */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct php_scratch);
} php_scratch_map SEC(".maps");

/* How the walks ended, per CPU, one per enum php_end. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PHP_END_MAX);
	__type(key, __u32);
	__type(value, __u64);
} php_counters SEC(".maps");

static __always_inline void php_count(__u32 end)
{
	if (end >= PHP_END_MAX)
		end = PHP_INVALID;
	__u64 *c = bpf_map_lookup_elem(&php_counters, &end);
	if (c)
		(*c)++;
}

/* php_forget drops a process's engine at its exec or exit. */
static __always_inline void php_forget(__u32 tgid)
{
	bpf_map_delete_elem(&php_procs, &tgid);
}

#if ARCH_TABLE_UNWIND

struct php_walk {
	struct php_proc *proc;
	struct php_scratch *s;
	__u64 *out; /* the sample's user frames */
};

static __always_inline int php_in_exec(struct php_proc *p, __u64 pc)
{
	/* Return addresses point after the call: one byte back is inside the function. */
	return (pc > p->exec_start && pc <= p->exec_end) || (pc > p->cold_start && pc <= p->cold_end) ||
	       (pc >= p->jit_start && pc < p->jit_end);
}

static __always_inline __u64 php_field(struct php_scratch *s, __u16 off)
{
	if (off > PHP_MAX_FRAME_READ - 8)
		return 0;
	return *(__u64 *)&s->ex[off & (PHP_MAX_FRAME_READ - 1)];
}

static __always_inline void php_emit(struct php_walk *w, __u64 v) { state_emit(&w->s->st, w->out, v); }

static __always_inline void php_close(struct php_walk *w) { state_close(&w->s->st, w->out); }

/* php_step reads one executor frame of the open activation and emits it. */
static __always_inline long php_step(struct php_walk *w)
{
	struct php_proc *p = w->proc;
	struct php_scratch *s = w->s;
	struct state_walk *st = &s->st;
	if (!st->frame) {
		php_close(w);
		st->tail = 0;
		return 0;
	}
	if (++st->walked > PHP_MAX_FRAMES) {
		st->end = PHP_TRUNCATED;
		return 1;
	}
	if (bpf_probe_read_user(s->ex, PHP_MAX_FRAME_READ, (void *)st->frame)) {
		st->end = PHP_BAD_READ;
		return 1;
	}
	__u64 func = php_field(s, p->ex_func);
	__u64 opline = php_field(s, p->ex_opline);
	__u64 next = php_field(s, p->ex_prev);
	__u32 info = 0;
	if (p->ex_call_info <= PHP_MAX_FRAME_READ - 4)
		info = *(__u32 *)&s->ex[p->ex_call_info & (PHP_MAX_FRAME_READ - 1)];
	if (next == st->frame || func == 0 || func & ((1 << PHP_FUNC_ALIGN_SHIFT) - 1) || func >> 47) {
		st->end = PHP_INVALID;
		return 1;
	}
	st->frame = next;
	__u64 head[2] = {};
	if (p->func_type > 15 || p->func_name > 8 || bpf_probe_read_user(head, sizeof(head), (void *)func)) {
		st->end = PHP_BAD_READ;
		return 1;
	}
	__u8 type = ((__u8 *)head)[p->func_type & 15];
	__u64 name = head[(p->func_name / 8) & 1], id = func, kind = 0, file = 0;
	if (type != PHP_INTERNAL_FUNCTION && !name &&
	    !bpf_probe_read_user(&file, sizeof(file), (void *)(func + p->op_array_filename)) && file &&
	    !(file & ((1 << PHP_FUNC_ALIGN_SHIFT) - 1)) && !(file >> 47)) {
		id = file;
		kind = 1;
	}
	__u32 line = 0;
	/* An internal function's frame has no opline of its own; a user frame's may be unset
	 * before its first instruction ran. */
	if (type != PHP_INTERNAL_FUNCTION && opline && bpf_probe_read_user(&line, sizeof(line), (void *)(opline + p->op_lineno)))
		line = 0;
	if (line > PHP_LINE_MASK)
		line = PHP_LINE_MASK;
	php_emit(w, INTERP_FRAME(PHP_RUNTIME, kind << PHP_KIND_SCRIPT_BIT | (id >> PHP_FUNC_ALIGN_SHIFT) << PHP_LINE_BITS | line));
	st->emitted = 1;
	/* The frame execute_ex was entered for ends its span: frames below it belong to the
	 * activation of execute_ex that called out of it through native code. */
	if (type != PHP_INTERNAL_FUNCTION && info & PHP_CALL_TOP && !st->tail)
		php_close(w);
	return 0;
}

STATE_MERGE_STEP(php, php_walk, php_in_exec, STATE_KEEP_ALL, php_step, PHP_TRUNCATED)

/* php_frames rewrites the sample's n user frames with the PHP frames of each execute_ex
 * activation among them and returns how many there are now. complete 0: the native walk
 * stopped short of the outermost frame, and PHP frames its activations left over go at the
 * root end. */
__noinline int php_frames(struct sample_event *e, __u32 n, __u32 complete)
{
	if (!e)
		return 0;
	if (n > MAX_USER_DEPTH)
		n = MAX_USER_DEPTH;
	__u32 pid = e->pid;
	struct php_proc *p = bpf_map_lookup_elem(&php_procs, &pid);
	/* exec_id 0: user space read the process before it knew its exec. */
	if (!p || (p->exec_id && p->exec_id != e->exec_id) || !p->current)
		return n;
	__u32 zero = 0;
	struct php_scratch *s = bpf_map_lookup_elem(&php_scratch_map, &zero);
	if (!s)
		return n;
	if (bpf_probe_read_kernel(s->native, n * sizeof(__u64), e->frames))
		return n;
	struct state_walk *st = &s->st;
	__builtin_memset(st, 0, sizeof(*st));
	st->n_in = n;
	st->tail = !complete;
	struct php_walk w = {.proc = p, .s = s, .out = e->frames};
	if (bpf_probe_read_user(&st->frame, sizeof(st->frame), (void *)p->current)) {
		php_count(PHP_BAD_READ);
		return n;
	}
	if (!st->frame) {
		php_count(PHP_NO_FRAME);
		return n;
	}
	bpf_loop(MAX_USER_DEPTH + PHP_MAX_FRAMES + 1, php_merge_step, &w, 0);
	__u32 out = st->n_out;
	if (out > MAX_USER_DEPTH)
		out = MAX_USER_DEPTH;
	php_count(st->end);
	return out;
}

/* The JIT's code, walked within the native walk as a JIT runtime's (runtimes.h lists PHP
 * there as php_jit, whose state is PHP's). */
#define php_jit_proc php_proc
#define php_jit_procs php_procs

static __always_inline int php_jit_in_code(struct php_proc *p, __u64 pc)
{
	return pc >= p->jit_start && pc < p->jit_end;
}

/* php_jit_frames records the frame of JIT code at st->pc and moves to execute_ex's caller:
 * the code runs on execute_ex's frame, whose CFA is jit_cfa above sp, or above rbp where
 * execute_ex keeps a frame pointer (the JIT leaves it be: the VM's handlers address the
 * frame by it when the JIT's code jumps back). Its stubs that are
 * called rather than jumped to have frames of their own; the return address found then
 * lies in no code with a table, and the walk ends there as it would have. */
__noinline long php_jit_frames(struct unwind_state *st, struct user_frames *frames, struct php_proc *p, __u32 pid, __u64 exec_id)
{
	/* Every argument is used: clang passes no value for one a global function ignores,
	 * which the verifier refuses at the call. pid 0 is the idle task's, with no user stack. */
	if (!st || !frames || !p || pid == 0 || (p->exec_id && p->exec_id != exec_id))
		return 1;
	if (st->n >= MAX_USER_DEPTH)
		return finish(st, UNWIND_TRUNCATED);
	frames->pc[st->n & (MAX_USER_DEPTH - 1)] = st->pc;
	st->n++;
	if (!p->jit_cfa)
		return fp_step(st);
	__u64 cfa = (p->jit_from_fp ? st->fp : st->sp) + p->jit_cfa, ra = 0, fp = st->fp;
	if (walker_read_user(&ra, cfa - 8))
		return finish(st, UNWIND_BAD_READ);
	if (p->jit_fp && walker_read_user(&fp, cfa - p->jit_fp))
		return finish(st, UNWIND_BAD_READ);
	return advance(st, cfa, ra, fp, 1);
}

#endif /* ARCH_TABLE_UNWIND */
#endif
