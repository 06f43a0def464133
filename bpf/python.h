/* CPython frames, interleaved with the native frames the walker found.
 *
 * The native walk records each activation of the interpreter's eval loop
 * (_PyEval_EvalFrameDefault) as one return address. Each activation runs a span of the
 * thread's Python frames, innermost first: one frame object (3.9, 3.10); frames up to and
 * including the first marked is_entry (3.11); frames up to the shim frame the activation
 * pushed on entry, owned by the C stack (3.12 to 3.15). python_frames replaces each
 * activation's native frame by its span, so a stack reads Python, C extension, libc in the
 * order they called each other, and keeps it where a span is empty.
 *
 * Everything it reads is the process's, which can lie: reads are checked, loops bounded by
 * PY_MAX_THREADS and PY_MAX_FRAMES, and offsets masked into the scratch buffer. It runs as
 * a global function, which the verifier checks once on its own, whatever the native walk
 * around it costs. sampler.bpf.c includes it after unwinder.h with the same helpers. */
#ifndef SONDE_PYTHON_H
#define SONDE_PYTHON_H

/* Python's number among the runtimes (types.h, enum interp_frame_encoding), and how its
 * 58 bits of a frame hold a code object and an instruction in it: the code object's
 * address >> PY_CODE_ALIGN_SHIFT (objects are 16-byte aligned and user addresses below
 * 2^47: 43 bits), then the instruction's offset in the code object's bytecode, in 2-byte
 * code units, saturated at PY_OFFSET_MASK. */
enum py_frame_encoding {
	PY_RUNTIME = 1,
	PY_CODE_ALIGN_SHIFT = 4,
	PY_OFFSET_BITS = 15,
	PY_OFFSET_MASK = (1 << 15) - 1,
};

/* How the walk of a CPython thread's frames ended . */
enum py_end {
	PY_COMPLETE = 0,  /* every eval-loop activation got its frames */
	PY_NO_THREAD = 1, /* no thread state of the interpreter belongs to the sampled thread */
	PY_BAD_READ = 2,  /* reading the interpreter's memory failed */
	PY_TRUNCATED = 3, /* MAX_USER_DEPTH frames and Python frames left */
	PY_INVALID = 4,   /* a frame the walk cannot follow: a misaligned code object, a loop */
	PY_END_MAX,
};

enum py_limits {
	PY_NO_OFFSET = 0xffff,     /* a py_proc offset the version does not have */
	PY_MAX_FRAME_READ = 128,   /* py_proc.frame_size at most */
	PY_MAX_THREADS = 512,      /* thread states searched for the sampled thread's */
	PY_MAX_FRAMES = 192,       /* Python frames walked per sample, shim frames included */
	PY_MAX_TLBC = 1 << 16,     /* a thread-local bytecode index past this is not believed */
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
	__u16 code_tag_bits;          /* bits of f_executable that tag the reference (3.14+'s
	                               * _PyStackRef), cleared to get the code object */
	__u16 frame_tlbc;             /* free-threaded: tlbc_index, the thread's copy of the
	                               * bytecode; PY_NO_OFFSET in builds with the GIL */
	__u16 code_tlbc;              /* free-threaded: PyCodeObject.co_tlbc, the copies */
	__u16 pad;
};

/* For bpf2go -type. */
const struct py_proc *unused_py_proc __attribute__((unused));
const enum py_end *unused_py_end __attribute__((unused));
const enum py_frame_encoding *unused_py_frame_encoding __attribute__((unused));
const enum py_frame_model *unused_py_frame_model __attribute__((unused));
const enum py_limits *unused_py_limits __attribute__((unused));

/* Per-process interpreter state, written by user space (package interp/python) when it
 * finds a CPython interpreter mapped, deleted at exec and exit like proc_maps. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct py_proc);
} py_procs SEC(".maps");

/* The thread state last found for a thread id: a search of the interpreter's thread list
 * per sample costs two reads per thread. An entry is checked against the thread before use,
 * so one a reused thread id left behind costs a search, not a wrong stack. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} py_threads SEC(".maps");

/* The walk's state (statewalk.h) lives in the per-CPU scratch map, not on the BPF stack:
 * the verifier tracks the value of every stack slot and explores the walk once per
 * combination it sees, where map values are numbers it knows nothing of, so their states
 * prune at once. */

/* The search of the thread list for the sampled thread's state, likewise. */
struct py_search {
	__u64 tstate;
	__u64 want; /* the sampled thread's pthread_t */
	__u32 found;
	__u32 bad;
};

struct py_scratch {
	struct state_walk st;
	struct py_search search;
	__u64 native[MAX_USER_DEPTH];
	__u8 frame[2 * PY_MAX_FRAME_READ]; /* a frame's bytes; offsets are masked below PY_MAX_FRAME_READ */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct py_scratch);
} py_scratch_map SEC(".maps");

/* How the walks ended, per CPU, one per enum py_end. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PY_END_MAX);
	__type(key, __u32);
	__type(value, __u64);
} py_counters SEC(".maps");

static __always_inline void py_count(__u32 end)
{
	if (end >= PY_END_MAX)
		end = PY_INVALID;
	__u64 *c = bpf_map_lookup_elem(&py_counters, &end);
	if (c)
		(*c)++;
}

/* python_forget drops a process's interpreter at its exec or exit. */
static __always_inline void python_forget(__u32 tgid)
{
	bpf_map_delete_elem(&py_procs, &tgid);
}

#if ARCH_TABLE_UNWIND

/* What the walk's callbacks need that only the stack can hold: pointers. */
struct py_walk {
	struct py_proc *proc;
	struct py_scratch *s;
	__u64 *out; /* the sample's user frames */
};

static long py_thread_step(__u32 i, void *ctx)
{
	struct py_walk *w = ctx;
	struct py_search *s = &w->s->search;
	__u64 id = 0;
	if (!s->tstate)
		return 1;
	if (bpf_probe_read_user(&id, sizeof(id), (void *)(s->tstate + w->proc->tstate_thread_id))) {
		s->bad = 1;
		return 1;
	}
	if (id == s->want) {
		s->found = 1;
		return 1;
	}
	if (bpf_probe_read_user(&s->tstate, sizeof(s->tstate), (void *)(s->tstate + w->proc->tstate_next))) {
		s->bad = 1;
		return 1;
	}
	return 0;
}

static __always_inline int py_in_eval(struct py_proc *p, __u64 pc)
{
	/* Return addresses point after the call: one byte back is inside the function. */
	return (pc > p->eval_start && pc <= p->eval_end) || (pc > p->cold_start && pc <= p->cold_end);
}

static __always_inline __u64 py_field(struct py_scratch *s, __u16 off)
{
	if (off >= PY_MAX_FRAME_READ)
		return 0;
	return *(__u64 *)&s->frame[off & (PY_MAX_FRAME_READ - 1)];
}

static __always_inline void py_emit(struct py_walk *w, __u64 v) { state_emit(&w->s->st, w->out, v); }

static __always_inline void py_close(struct py_walk *w) { state_close(&w->s->st, w->out); }

/* py_step reads one Python frame of the open activation and emits it. */
static __always_inline long py_step(struct py_walk *w)
{
	struct py_proc *p = w->proc;
	struct py_scratch *s = w->s;
	struct state_walk *st = &s->st;
	if (!st->frame) {
		py_close(w);
		st->tail = 0;
		return 0;
	}
	if (++st->walked > PY_MAX_FRAMES) {
		st->end = PY_TRUNCATED;
		return 1;
	}
	__u32 size = p->frame_size;
	if (size > PY_MAX_FRAME_READ)
		size = PY_MAX_FRAME_READ;
	if (bpf_probe_read_user(s->frame, size, (void *)st->frame)) {
		st->end = PY_BAD_READ;
		return 1;
	}
	__u64 code = py_field(s, p->frame_code) & ~(__u64)p->code_tag_bits;
	__u64 next = py_field(s, p->frame_previous);
	if (next == st->frame) {
		st->end = PY_INVALID;
		return 1;
	}
	st->frame = next;
	__u8 last = p->model == PY_MODEL_FRAME_OBJECT; /* one frame object per activation */
	if (p->model == PY_MODEL_SHIM_FRAME && p->frame_owner < PY_MAX_FRAME_READ &&
	    s->frame[p->frame_owner & (PY_MAX_FRAME_READ - 1)] == 3 /* FRAME_OWNED_BY_CSTACK */) {
		/* The shim the activation pushed on entry: not code anyone wrote. */
		py_close(w);
		return 0;
	}
	if (p->model == PY_MODEL_ENTRY_FLAG && p->frame_is_entry < PY_MAX_FRAME_READ &&
	    s->frame[p->frame_is_entry & (PY_MAX_FRAME_READ - 1)])
		last = 1;
	if (code & ((1 << PY_CODE_ALIGN_SHIFT) - 1) || code == 0 || code >> 47) {
		st->end = PY_INVALID;
		return 1;
	}
	if (code == p->skip_code) {
		/* A shim the interpreter runs between two frames (3.13's __init__ cleanup):
		 * nothing anyone wrote. */
		if (last && !st->tail)
			py_close(w);
		return 0;
	}
	__u64 units = 0;
	if (p->model == PY_MODEL_FRAME_OBJECT) {
		__s32 lasti = 0;
		if (p->frame_instr < PY_MAX_FRAME_READ - 4)
			lasti = *(__s32 *)&s->frame[p->frame_instr & (PY_MAX_FRAME_READ - 1)];
		if (lasti > 0)
			units = p->lasti_bytes ? (__u64)lasti / 2 : (__u64)lasti;
	} else {
		__u64 instr = py_field(s, p->frame_instr);
		__u64 base = code + p->code_adaptive;
		/* A free-threaded build runs threads other than the first on copies of the
		 * bytecode: entry tlbc_index of the code object's co_tlbc array (a size, then
		 * the entries; entry 0 is co_code_adaptive). */
		if (p->frame_tlbc < PY_MAX_FRAME_READ - 4) {
			__s32 idx = *(__s32 *)&s->frame[p->frame_tlbc & (PY_MAX_FRAME_READ - 1)];
			__u64 tlbc = 0;
			/* A copy that cannot be read leaves the instruction unknown (saturated
			 * below): the frame keeps its name, at its function's first line. */
			if (idx > 0 && idx < PY_MAX_TLBC &&
			    (bpf_probe_read_user(&tlbc, sizeof(tlbc), (void *)(code + p->code_tlbc)) || !tlbc ||
			     bpf_probe_read_user(&base, sizeof(base), (void *)(tlbc + 8 + 8 * (__u64)idx))))
				base = 0;
		}
		if (!base)
			units = PY_OFFSET_MASK;
		else if (instr > base)
			units = (instr - base) / 2;
	}
	if (units > PY_OFFSET_MASK)
		units = PY_OFFSET_MASK;
	py_emit(w, INTERP_FRAME(PY_RUNTIME, (code >> PY_CODE_ALIGN_SHIFT) << PY_OFFSET_BITS | units));
	st->emitted = 1;
	if (last && !st->tail)
		py_close(w);
	return 0;
}

STATE_MERGE_STEP(py, py_walk, py_in_eval, STATE_KEEP_ALL, py_step, PY_TRUNCATED)

/* py_current_frame returns the innermost frame of the thread state whose thread is the
 * sampled one, or 0. */
static __always_inline __u64 py_current_frame(struct py_walk *w, __u32 tid, __u32 *end)
{
	struct py_proc *p = w->proc;
	struct py_search *s = &w->s->search;
	s->want = ARCH_THREAD_POINTER(bpf_get_current_task_btf());
	s->found = 0;
	s->bad = 0;
	__u64 *cached = bpf_map_lookup_elem(&py_threads, &tid);
	if (cached) {
		__u64 id = 0;
		if (!bpf_probe_read_user(&id, sizeof(id), (void *)(*cached + p->tstate_thread_id)) && id == s->want) {
			s->tstate = *cached;
			s->found = 1;
		}
	}
	if (!s->found) {
		__u64 interp = 0;
		if (bpf_probe_read_user(&interp, sizeof(interp), (void *)(p->runtime + p->interp_head)) || !interp ||
		    bpf_probe_read_user(&s->tstate, sizeof(s->tstate), (void *)(interp + p->threads_head))) {
			*end = PY_BAD_READ;
			return 0;
		}
		bpf_loop(PY_MAX_THREADS, py_thread_step, w, 0);
		if (s->bad) {
			*end = PY_BAD_READ;
			return 0;
		}
		if (!s->found) {
			*end = PY_NO_THREAD;
			return 0;
		}
		__u64 tstate = s->tstate;
		bpf_map_update_elem(&py_threads, &tid, &tstate, BPF_ANY);
	}
	__u64 frame = 0;
	if (bpf_probe_read_user(&frame, sizeof(frame), (void *)(s->tstate + p->tstate_frame))) {
		*end = PY_BAD_READ;
		return 0;
	}
	if (frame && p->cframe_frame != PY_NO_OFFSET &&
	    bpf_probe_read_user(&frame, sizeof(frame), (void *)(frame + p->cframe_frame))) {
		*end = PY_BAD_READ;
		return 0;
	}
	return frame;
}

/* python_frames rewrites the sample's n user frames with the Python frames of each eval
 * loop activation among them and returns how many there are now. The dispatch calls it
 * when a native frame lies in the eval loop (or the native walk stopped short of the
 * outermost frame, complete 0: then Python frames its activations left over go at the
 * root end). */
__noinline int python_frames(struct sample_event *e, __u32 n, __u32 complete)
{
	if (!e)
		return 0;
	if (n > MAX_USER_DEPTH)
		n = MAX_USER_DEPTH;
	__u32 pid = e->pid;
	struct py_proc *p = bpf_map_lookup_elem(&py_procs, &pid);
	/* exec_id 0: user space read the process before it knew its exec. */
	if (!p || (p->exec_id && p->exec_id != e->exec_id) || p->model == PY_MODEL_NONE || p->model >= PY_MODEL_MAX)
		return n;
	__u32 zero = 0;
	struct py_scratch *s = bpf_map_lookup_elem(&py_scratch_map, &zero);
	if (!s)
		return n;
	/* A thread outside the eval loop runs no Python: no need to find its frames. */
	if (bpf_probe_read_kernel(s->native, n * sizeof(__u64), e->frames))
		return n;
	struct state_walk *st = &s->st;
	__builtin_memset(st, 0, sizeof(*st));
	st->n_in = n;
	st->tail = !complete;
	struct py_walk w = {.proc = p, .s = s, .out = e->frames};
	__u32 end = PY_COMPLETE;
	st->frame = py_current_frame(&w, e->tid, &end);
	if (!st->frame) {
		py_count(end);
		return n;
	}
	bpf_loop(MAX_USER_DEPTH + PY_MAX_FRAMES + 1, py_merge_step, &w, 0);
	__u32 out = st->n_out;
	if (out > MAX_USER_DEPTH)
		out = MAX_USER_DEPTH;
	end = st->end;
	py_count(end);
	return out;
}

#endif /* ARCH_TABLE_UNWIND */
#endif
