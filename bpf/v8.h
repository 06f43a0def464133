/* V8 (Node.js) frames, walked within the native walk.
 *
 * V8 keeps frame pointers in the code it generates (interpreter, baseline, Maglev and
 * TurboFan code, and its builtins): each JavaScript frame holds its context at
 * fp+off_fp_context and its JSFunction at fp+off_fp_function; each other frame (entry,
 * exit, stub, builtin frames) holds a frame type marker, a small integer with the Smi tag,
 * where a JavaScript frame holds its context. V8's code has no unwind tables (node's
 * file's table says its builtins are walked by frame pointer): the native walk hands a
 * frame of it to v8_frames (through walker_no_table), which walks V8's frames by frame
 * pointer, reading each frame's words and its caller's in one read, and hands the walk
 * back at the first frame outside V8's code (the entry frame's caller in C++), so that
 * node's and libuv's frames below stay complete.
 *
 * A JavaScript frame is recorded for user space to name:
 * - interpreted code (the pc lies in the interpreter: its entry trampoline or a bytecode
 *   handler) as the BytecodeArray and the bytecode offset the frame holds, the function
 *   that ran it noted beside (v8_functions);
 * - other builtins' JavaScript frames (the pc lies elsewhere in the embedded builtins) as
 *   their SharedFunctionInfo;
 * - code V8 compiled (baseline, Maglev, TurboFan: the pc lies in the JIT's code) as its pc,
 *   from which user space finds the code object, its inlined functions and source position.
 * Other frames keep their native address: builtins are named by node's symbols.
 *
 * Offsets are V8's own postmortem metadata (v8dbg_* in the node binary), read by package
 * interp/node. Everything read here is the process's, which can lie: reads are checked, each
 * caller's frame must lie above its callee's, and the walk keeps MAX_USER_DEPTH. v8_frames
 * and v8_step are global functions, each verified once on its own. */
#ifndef SONDE_V8_H
#define SONDE_V8_H

/* V8's number among the runtimes, and how its 58 bits of a frame hold what user space
 * names. Bits 57-56 say the kind. V8_KIND_JIT: bit 47 says the pc is a return address (not
 * the interrupted instruction), bits 46-0 the pc. V8_KIND_BYTECODE: the SharedFunctionInfo's
 * address >> V8_SFI_SHIFT (tagged objects are 8-byte aligned; user addresses below 2^47:
 * 44 bits) above the bytecode offset, saturated at V8_OFFSET_MASK. V8_KIND_BYTECODE_ARRAY:
 * the same with the BytecodeArray's address. */
enum v8_frame_encoding {
	V8_RUNTIME = 3,
	V8_KIND_SHIFT = 56,
	V8_KIND_JIT = 0,
	V8_KIND_BYTECODE = 1,
	V8_KIND_BYTECODE_ARRAY = 2,
	V8_RETURN_BIT = 47,
	V8_SFI_SHIFT = 3,
	V8_OFFSET_BITS = 12,
	V8_OFFSET_MASK = (1 << 12) - 1,
};

/* How a walk of V8 frames ended. */
enum v8_end {
	V8_COMPLETE = 0,  /* the chain was followed until it left V8's code */
	V8_BAD_READ = 1,  /* reading a frame failed: the stack ends there */
	V8_TRUNCATED = 2, /* MAX_USER_DEPTH frames */
	V8_END_MAX,
};

/* Where a V8 process keeps its code and how its frames are laid out. */
struct v8_proc {
	__u64 exec_id;                        /* the exec the addresses belong to; 0: unknown */
	__u64 builtins_start, builtins_end;   /* the embedded builtins in the binary's text */
	__u64 remap_start, remap_end;         /* their copy V8 maps beside its code (short builtin calls), or 0, 0 */
	__u64 jit_start, jit_end;             /* the anonymous executable mappings, as one span */
	/* The interpreter's code, as offsets into the builtins (either copy): its entry
	 * trampolines and its bytecode handlers; empty ones when not known. */
	__u32 entry_start, entry_end;
	__u32 handlers_start, handlers_end;
	__s16 off_fp_context;                 /* context or frame type marker, from fp */
	__s16 off_fp_function;                /* JSFunction */
	__s16 off_fp_bytecode_offset;         /* an interpreted frame's bytecode offset (a Smi) */
	__s16 off_fp_bytecode_array;          /* its BytecodeArray; 0: not within the frame's read */
	__u16 function_shared;                /* JSFunction: shared, from the untagged object */
	__u8 smi_shift;                       /* Smi value shift: 32 without pointer compression, 1 with */
	__u8 type_entry, type_construct_entry; /* frame types whose caller is C++ */
	__u8 pad[3];
};

/* For bpf2go -type. */
const struct v8_proc *unused_v8_proc __attribute__((unused));
const enum v8_end *unused_v8_end __attribute__((unused));
const enum v8_frame_encoding *unused_v8_frame_encoding __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct v8_proc);
} v8_procs SEC(".maps");

/* The function (SharedFunctionInfo) a frame running some code held, by the code's address:
 * a pc of compiled code, or an interpreted frame's BytecodeArray. User space names
 * baseline code (Sparkplug), which does not say its function, and interpreted frames by
 * it, once the function's bytecode is the frame's; it checks optimized code's outermost
 * function against it. So code that took the place of the sampled code, or a function at
 * the address of one gone, is not named in its stead. */
struct v8_code_key {
	__u32 pid;
	__u32 pad;
	__u64 code;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, struct v8_code_key);
	__type(value, __u64);
} v8_functions SEC(".maps");

/* The walk's state, in a per-CPU map rather than on the stack (see python.h). */
struct v8_state {
	__u64 exec_id; /* whose frames: the sample's process, for v8_note_function */
	__u32 pid;
	__u32 end;     /* enum v8_end */
	/* the previous frame was V8's and not its entry: its caller is V8's too, wherever its
	 * code lies (JIT code on pages the host has not seen yet) */
	__u8 in_v8;
	__u8 pad[7];
};

/* What v8_note_function last found for a frame's code, so that the same code run by the
 * same function on this CPU skips its read of the function (the V8 heap, seldom in the
 * caches) and its map lookup: most samples of a busy program show frames earlier ones did.
 * A frame is keyed by its code (pc or BytecodeArray) and its JSFunction: a reused address
 * of either gives another key or, for both at once, a function user space checks against
 * the code it finds at that address (a JSFunction's address alone is reused by the young
 * generation's collections within milliseconds). An entry serves V8_MEMO_USES times, then
 * is looked up again, so that an entry the LRU map let go is written again soon. Four
 * ways a set, the entry used least lately making room, as in struct row_memo. */
#define V8_MEMO_WAYS 4
#define V8_MEMO_SETS 32
#define V8_MEMO_USES 32

struct v8_memo {
	__u64 pc, fn, exec_id;
	__u32 pid, uses;
	__u32 used; /* the memo's clock when last found or written; 0: never */
	__u32 pad;
};

struct v8_scratch {
	struct v8_state st;
	__u64 slots[8]; /* fp-48 .. fp+8 */
	struct v8_memo memo[V8_MEMO_SETS * V8_MEMO_WAYS];
	__u32 clock; /* counts lookups, for the memo's used (wraps as struct row_memo's) */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct v8_scratch);
} v8_scratch_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, V8_END_MAX);
	__type(key, __u32);
	__type(value, __u64);
} v8_counters SEC(".maps");

static __always_inline void v8_count(__u32 end)
{
	if (end >= V8_END_MAX)
		end = V8_BAD_READ;
	__u64 *c = bpf_map_lookup_elem(&v8_counters, &end);
	if (c)
		(*c)++;
}

/* v8_forget drops a process's V8 at its exec or exit. */
static __always_inline void v8_forget(__u32 tgid)
{
	bpf_map_delete_elem(&v8_procs, &tgid);
}

#if ARCH_TABLE_UNWIND

struct v8_walk {
	struct unwind_state *st;
	struct user_frames *frames;
	struct v8_proc *p;
	struct v8_scratch *s;
};

static __always_inline int v8_in_builtins(struct v8_proc *p, __u64 pc)
{
	return (pc >= p->builtins_start && pc <= p->builtins_end) || (pc >= p->remap_start && pc <= p->remap_end);
}

/* v8_in_interpreter tells whether pc, in the builtins, lies in the interpreter's code: a
 * frame there is an interpreted function's, which holds its BytecodeArray. */
static __always_inline int v8_in_interpreter(struct v8_proc *p, __u64 pc)
{
	__u64 off = pc >= p->remap_start && pc <= p->remap_end ? pc - p->remap_start : pc - p->builtins_start;
	return (off >= p->entry_start && off <= p->entry_end) || (off >= p->handlers_start && off <= p->handlers_end);
}

/* v8_in_code tells whether pc lies in V8's code: its builtins or its JIT's. A return
 * address points after its call, which may be the region's last byte. */
static __always_inline int v8_in_code(struct v8_proc *p, __u64 pc)
{
	return v8_in_builtins(p, pc) || (pc >= p->jit_start && pc <= p->jit_end);
}

static __always_inline void v8_emit(struct v8_walk *w, __u64 v)
{
	struct unwind_state *st = w->st;
	if (st->n >= MAX_USER_DEPTH)
		return;
	w->frames->pc[st->n & (MAX_USER_DEPTH - 1)] = v;
	st->n++;
}

/* v8_emit_jit records a frame of compiled code by its pc. */
static __always_inline void v8_emit_jit(struct v8_walk *w, __u64 pc, int ret)
{
	__u64 r = ret ? 1ULL << V8_RETURN_BIT : 0;
	v8_emit(w, INTERP_FRAME(V8_RUNTIME, (__u64)V8_KIND_JIT << V8_KIND_SHIFT | r | (pc & ((1ULL << 47) - 1))));
}

/* v8_slot returns the frame's word at fp+off, off within [-48, 8]. */
static __always_inline __u64 v8_slot(struct v8_scratch *s, __s16 off)
{
	__s32 o = off + 48;
	if (o < 0 || o > 56)
		return 0;
	__u32 i = (__u32)o >> 3;
	if (i > 7)
		return 0;
	return s->slots[i];
}

/* v8_bytecode_offset returns the frame's bytecode offset, saturated at V8_OFFSET_MASK. */
static __always_inline __u64 v8_bytecode_offset(struct v8_proc *p, struct v8_scratch *s)
{
	__s64 off = (__s64)v8_slot(s, p->off_fp_bytecode_offset) >> (p->smi_shift & 63);
	__u64 o = off < 0 ? 0 : (__u64)off;
	return o > V8_OFFSET_MASK ? V8_OFFSET_MASK : o;
}

/* v8_frameless_caller tells whether the interrupted builtin runs in its caller's frame:
 * the word at sp, its return address, lies in compiled code (an interpreted caller's
 * bytecode handlers run in the interpreter's frame and return to builtins). *ra gets it. */
static __always_inline int v8_frameless_caller(struct v8_walk *w, __u64 *ra)
{
	struct v8_proc *p = w->p;
	__u64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (void *)w->st->sp))
		return 0;
	/* The builtins' copy V8 maps beside its code (Node 24) lies within the JIT's span: a
	 * return address there is a builtin's, as an interpreted frame's handlers leave. */
	if (v < p->jit_start || v > p->jit_end || v8_in_builtins(p, v))
		return 0;
	/* A return address follows a call: call rel32 (e8 and 4 bytes), or call through a
	 * register (ff d0+r, with a REX prefix for r8-r15). A word the builtin keeps on its
	 * own frame would rarely pass. */
	__u8 b[8];
	if (bpf_probe_read_user(b, sizeof(b), (void *)(v - 8)))
		return 0;
	if (b[3] != 0xe8 && !(b[6] == 0xff && (b[7] & 0xf8) == 0xd0))
		return 0;
	*ra = v;
	return 1;
}

/* v8_note_function remembers the function fn a frame running code (a pc of compiled code,
 * or a BytecodeArray) holds, by the code's address, for user space (v8_functions): the
 * identity of what ran there, checked against the code user space finds at that address
 * when it reads it later. Written only when it changed. */
static __always_inline void v8_note_function(struct v8_walk *w, __u64 fn, __u64 pc)
{
	struct v8_state *vs = &w->s->st;
	struct v8_memo *set = &w->s->memo[((pc ^ (pc >> 6) ^ (fn >> 3)) & (V8_MEMO_SETS - 1)) * V8_MEMO_WAYS], *m = NULL;
	__u32 now = ++w->s->clock, victim = 0;
	for (__u32 i = 0; i < V8_MEMO_WAYS; i++) {
		if (set[i].pc == pc && set[i].fn == fn && set[i].pid == vs->pid && set[i].exec_id == vs->exec_id) {
			m = &set[i];
			break;
		}
		if (set[i].used < set[victim & (V8_MEMO_WAYS - 1)].used)
			victim = i;
	}
	if (m) {
		m->used = now;
		if (m->uses < V8_MEMO_USES) {
			m->uses++;
			return;
		}
	}
	__u64 sfi = 0;
	if (bpf_probe_read_user(&sfi, sizeof(sfi), (void *)(fn - 1 + w->p->function_shared)) || (sfi & 3) != 1)
		return;
	struct v8_code_key k = {.pid = vs->pid, .code = pc};
	__u64 *old = bpf_map_lookup_elem(&v8_functions, &k);
	if (!old || *old != sfi)
		bpf_map_update_elem(&v8_functions, &k, &sfi, BPF_ANY);
	if (!m) {
		m = &set[victim & (V8_MEMO_WAYS - 1)];
		m->used = now;
	}
	m->pc = pc;
	m->fn = fn;
	m->exec_id = vs->exec_id;
	m->pid = vs->pid;
	m->uses = 0;
}

/* v8_step records the frame at st->pc, V8's code, and moves to its caller by the frame
 * pointer: one read takes the frame's marker or function and the caller's frame pointer
 * and return address. It returns 1 when the walk ends. A global function, verified once
 * on its own. */
__noinline long v8_step(struct unwind_state *st, struct user_frames *frames, struct v8_proc *p, struct v8_scratch *s)
{
	if (!st || !frames || !p || !s)
		return 1;
	struct v8_walk w = {.st = st, .frames = frames, .p = p, .s = s};
	struct v8_state *vs = &s->st;
	__u64 pc = st->pc, fp = st->fp;
	int builtin = v8_in_builtins(p, pc);
	/* The interrupted frame itself, not one a signal interrupted. */
	int leaf = st->pc_exact && st->n == 0;
	st->used_fp = 1;
	st->frameless = 0;
	if (fp == 0) {
		v8_emit(&w, pc);
		return finish(st, UNWIND_COMPLETE);
	}
	if (fp < 48 || fp >> 47 || bpf_probe_read_user(s->slots, sizeof(s->slots), (void *)(fp - 48))) {
		vs->end = V8_BAD_READ;
		v8_emit(&w, pc);
		return finish(st, UNWIND_FP_BROKEN);
	}
	__u64 next_fp = s->slots[6], ret = s->slots[7];
	__u64 marker = v8_slot(s, p->off_fp_context);
	vs->in_v8 = 1;
	if (!(marker & 1)) {
		/* A typed frame: a builtin's or a stub's; its address names it. An entry frame's
		 * caller is C++. */
		__u64 type = marker >> 1;
		if (type == p->type_entry || type == p->type_construct_entry)
			vs->in_v8 = 0;
		v8_emit(&w, pc);
	} else {
		__u64 fn = v8_slot(s, p->off_fp_function), caller = 0;
		if ((fn & 3) != 1 || fn >> 47) {
			v8_emit(&w, pc);
		} else if (builtin && leaf && v8_frameless_caller(&w, &caller)) {
			/* A builtin that set up no frame of its own, interrupted: the frame is its
			 * caller's, compiled code, whose pc is the return address at sp; the frame
			 * pointer leads past it. */
			v8_emit(&w, pc);
			v8_note_function(&w, fn, caller);
			v8_emit_jit(&w, caller, 1);
		} else if (builtin && p->off_fp_bytecode_array && v8_in_interpreter(p, pc)) {
			/* Interpreted: the frame holds its BytecodeArray and its offset in it. The
			 * array is the frame's record; its function is noted beside, read only when
			 * this CPU has not seen the pair lately. */
			__u64 bc = v8_slot(s, p->off_fp_bytecode_array);
			if ((bc & 3) != 1 || bc >> 47) {
				v8_emit(&w, pc);
			} else {
				v8_note_function(&w, fn, bc);
				v8_emit(&w, INTERP_FRAME(V8_RUNTIME, (__u64)V8_KIND_BYTECODE_ARRAY << V8_KIND_SHIFT |
									     ((bc >> V8_SFI_SHIFT) & ((1ULL << 44) - 1)) << V8_OFFSET_BITS |
									     v8_bytecode_offset(p, s)));
			}
		} else if (builtin) {
			/* A builtin's JavaScript frame: its function names it. */
			__u64 sfi = 0;
			if (bpf_probe_read_user(&sfi, sizeof(sfi), (void *)(fn - 1 + p->function_shared)) || (sfi & 3) != 1 ||
			    sfi >> 47) {
				v8_emit(&w, pc);
			} else {
				v8_emit(&w, INTERP_FRAME(V8_RUNTIME, (__u64)V8_KIND_BYTECODE << V8_KIND_SHIFT |
									     ((sfi >> V8_SFI_SHIFT) & ((1ULL << 44) - 1)) << V8_OFFSET_BITS |
									     v8_bytecode_offset(p, s)));
			}
		} else {
			v8_note_function(&w, fn, pc);
			v8_emit_jit(&w, pc, !st->pc_exact);
		}
	}
	return advance(st, fp + 16, ret, next_fp, 1);
}

static long v8_frame_step(__u32 i, void *ctx)
{
	struct v8_walk *w = ctx;
	struct unwind_state *st = w->st;
	if (st->done)
		return 1;
	if (!w->s->st.in_v8 && !v8_in_code(w->p, st->pc))
		return 1; /* native code again: the native walk goes on */
	if (st->n >= MAX_USER_DEPTH) {
		w->s->st.end = V8_TRUNCATED;
		finish(st, UNWIND_TRUNCATED);
		return 1;
	}
	return v8_step(st, w->frames, w->p, w->s) ? 1 : 0;
}

/* v8_frames walks V8's frames from the frame at st->pc, which lies in V8's code (not yet
 * recorded), records them, and leaves st at the first frame outside it. It returns 1
 * when the walk ends there, as walker_step does. A global function, verified once on its
 * own. */
__noinline long v8_frames(struct unwind_state *st, struct user_frames *frames, struct v8_proc *p, __u32 pid, __u64 exec_id)
{
	if (!st || !frames || !p)
		return 1;
	__u32 zero = 0;
	struct v8_scratch *s = bpf_map_lookup_elem(&v8_scratch_map, &zero);
	if (!s)
		return 1;
	s->st.pid = pid;
	s->st.exec_id = exec_id;
	s->st.end = V8_COMPLETE;
	s->st.in_v8 = 0;
	struct v8_walk w = {.st = st, .frames = frames, .p = p, .s = s};
	bpf_loop(MAX_USER_DEPTH, v8_frame_step, &w, 0);
	v8_count(s->st.end);
	return st->done;
}

#endif /* ARCH_TABLE_UNWIND */
#endif
