/* HotSpot (JVM) frames, walked where the native walk reaches the JVM's code cache.
 *
 * The code HotSpot generates (its template interpreter, the methods C1 and C2 compile,
 * its stubs and adapters) lies in one reserved range, the code cache, and has no unwind
 * tables: the native walk hands a frame there to jvm_frames (through walker_no_table),
 * which walks the Java frames up to the first frame outside the code cache (the call
 * stub's caller in libjvm, JavaCalls::call_helper) and hands the walk back, its
 * registers set for that frame, so that the native frames below stay complete. Each
 * frame is found as HotSpot's own frame::sender finds it on x86_64:
 * - an interpreted frame (the pc lies in the interpreter) keeps rbp as its frame pointer:
 *   the Method* and bytecode pointer at slots the JVM's tables give, the caller's return
 *   address and rbp above it, and the caller's stack pointer before it extended the stack
 *   for the call (the sender sp slot), which a compiled caller's frame size counts from;
 * - a code blob with a frame size (an nmethod, a runtime stub) has a fixed frame: the
 *   caller's stack pointer is sp plus the frame size, the return address and the caller's
 *   rbp the two words below it. The blob holding the pc is found as the JVM finds it, by
 *   walking the code heap's segment map back to the block's start;
 * - a blob without one (the call stub, adapters, the arraycopy and other stubs) keeps rbp
 *   as its frame pointer, or, in the leaf, may not have set up a frame yet.
 * The interrupted frame may be in a prologue or an epilogue, where its frame is not the
 * whole frame: its caller is taken from where a return address into the code cache is.
 *
 * A frame is recorded for user space to name (interp/jvm): an interpreted frame as its
 * Method* and bci; any other as its pc, with the low bits of the blob's compile id, so
 * that code compiled later at the same address is not named in its stead. Everything
 * read is the process's, which can lie: each read is checked, each caller must lie above
 * its callee, and a Java frame's caller must be code of the code cache. A global
 * function, verified once on its own. */
#ifndef SONDE_JVM_H
#define SONDE_JVM_H

/* HotSpot's number among the runtimes, and how its 58 bits of a frame hold what user
 * space names. Bit 57 says the kind. JVM_KIND_CODE: bit 47 says the pc is a return
 * address, bits 46-0 the pc, bits 55-48 the low 8 bits of the blob's compile id (an
 * nmethod's; other blobs' bits there mean nothing). JVM_KIND_INTERPRETED: the Method*
 * >> JVM_METHOD_SHIFT (44 bits) above the bci in JVM_BCI_BITS, JVM_BCI_UNKNOWN where it
 * is not known. */
enum jvm_frame_encoding {
	JVM_RUNTIME = 4,
	JVM_KIND_BIT = 57,
	JVM_KIND_CODE = 0,
	JVM_KIND_INTERPRETED = 1,
	JVM_RETURN_BIT = 47,
	JVM_TAG_SHIFT = 48,
	JVM_METHOD_SHIFT = 3,
	JVM_BCI_BITS = 13,
	JVM_BCI_UNKNOWN = (1 << 13) - 1,
};

/* How a walk of Java frames ended: each entry into the code cache counts once. */
enum jvm_end {
	JVM_COMPLETE = 0,  /* the Java frames led back to native code, or to the stack's end */
	JVM_NO_HEAP = 1,   /* a pc in the code cache outside every code heap */
	JVM_NO_BLOB = 2,   /* the segment map led to no code blob holding the pc */
	JVM_BAD_READ = 3,  /* a frame, the segment map or a blob could not be read */
	JVM_BAD_FRAME = 4, /* a frame's caller is not where its layout says: the walk ends there */
	JVM_TRUNCATED = 5, /* MAX_USER_DEPTH frames */
	JVM_END_MAX,
};

/* Bounds of what the walker reads, which user space checks the JVM's layout against. */
enum jvm_limits {
	JVM_MAX_HEAPS = 4,             /* HotSpot has at most three code heaps */
	JVM_SLOTS_BELOW = 80,          /* interpreter frame slots read from fp-80 ... */
	JVM_SLOTS = 12,                /* ... to fp+16 */
	JVM_BLOB_READ = 512,           /* a blob's header fields lie in its first bytes */
	JVM_SEGMAP_HOPS = 64,          /* hops back through a segment map: a blob of 4000 segments */
	JVM_MAX_FRAME_WORDS = 1 << 16, /* a blob's frame size, in words */
	JVM_MAX_SENDER_SP = 1 << 20,   /* an interpreted frame's sender sp, from its fp */
};

struct jvm_heap {
	__u64 low, end; /* the heap's span of the code cache */
	__u64 segmap;   /* its segment map: a byte per segment */
	__u32 log2_segment;
	__u32 pad;
};

/* Where a HotSpot process keeps its code and how its frames and blobs are laid out, as
 * its own tables say (interp/jvm: KernelState). Offsets are in bytes. */
struct jvm_proc {
	__u64 exec_id; /* the exec the addresses belong to; 0: unknown */
	__u64 code_low, code_high;       /* the code cache, reserved */
	__u64 interp_start, interp_end;  /* the template interpreter's code */
	struct jvm_heap heaps[JVM_MAX_HEAPS];
	__u32 heap_count;
	__s16 fp_method, fp_bcp, fp_sender_sp; /* interpreter frame slots from fp, in [-JVM_SLOTS_BELOW, -8] */
	__u16 method_const_method;             /* Method: its ConstMethod */
	__u16 const_method_size;               /* the bytecodes follow the ConstMethod */
	__u16 heap_block_size;                 /* a block's header before its blob */
	/* Code blob fields, each within the first blob_read bytes */
	__u16 blob_size, blob_frame_size, blob_code_begin, blob_frame_complete, nmethod_compile_id;
	__u16 blob_read;
	__u8 code_begin_is_pointer; /* _code_begin is a pointer (JDK 17), else an offset from the blob */
	__u8 frame_complete_16;     /* _frame_complete_offset is 16 bits wide (JDK 25), else 32 */
	__u8 pad[2];
};

/* For bpf2go -type. */
const struct jvm_proc *unused_jvm_proc __attribute__((unused));
const enum jvm_end *unused_jvm_end __attribute__((unused));
const enum jvm_frame_encoding *unused_jvm_frame_encoding __attribute__((unused));
const enum jvm_limits *unused_jvm_limits __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct jvm_proc);
} jvm_procs SEC(".maps");

struct jvm_scratch {
	__u64 slots[JVM_SLOTS];
	__u8 blob[JVM_BLOB_READ];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct jvm_scratch);
} jvm_scratch_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, JVM_END_MAX);
	__type(key, __u32);
	__type(value, __u64);
} jvm_counters SEC(".maps");

/* jvm_forget drops a process's JVM at its exec or exit. */
static __always_inline void jvm_forget(__u32 tgid)
{
	bpf_map_delete_elem(&jvm_procs, &tgid);
}

#if ARCH_TABLE_UNWIND && defined(__TARGET_ARCH_x86)

struct jvm_walk {
	struct unwind_state *st;
	struct user_frames *frames;
	struct jvm_proc *p;
	struct jvm_scratch *s;
	__u32 end;
};

static __always_inline int jvm_in_code(struct jvm_proc *p, __u64 a)
{
	return a >= p->code_low && a < p->code_high;
}

static __always_inline void jvm_emit(struct jvm_walk *w, __u64 payload)
{
	struct unwind_state *st = w->st;
	w->frames->pc[st->n & (MAX_USER_DEPTH - 1)] = INTERP_FRAME(JVM_RUNTIME, payload);
	st->n++;
}

static __always_inline void jvm_emit_code(struct jvm_walk *w, __u64 pc, __u32 compile_id)
{
	__u64 ret = w->st->pc_exact ? 0 : 1ULL << JVM_RETURN_BIT;
	jvm_emit(w, (__u64)JVM_KIND_CODE << JVM_KIND_BIT | (__u64)(compile_id & 0xff) << JVM_TAG_SHIFT | ret |
			    (pc & ((1ULL << 47) - 1)));
}

/* jvm_stop ends the whole walk: what lies beyond a Java frame whose caller is lost
 * cannot be found by the native walk either. */
static __always_inline long jvm_stop(struct jvm_walk *w, __u32 end, __u32 unwind_end)
{
	w->end = end;
	finish(w->st, unwind_end);
	return 1;
}

/* jvm_is_return tells whether a is a return address into the code cache: into the
 * interpreter (which pushes the return address of its calls itself, at one of its return
 * entries, and jumps), or after a call instruction: rel32, or indirect through a register
 * or memory. A word that merely points into compiled code rarely passes. */
__noinline int jvm_is_return(struct jvm_proc *p, __u64 a)
{
	if (!p || !jvm_in_code(p, a))
		return 0;
	if (a >= p->interp_start && a < p->interp_end)
		return 1;
	__u8 b[8];
	if (bpf_probe_read_user(b, sizeof(b), (void *)(a - 8)))
		return 0;
	if (b[3] == 0xe8) /* call rel32 */
		return 1;
	/* call through a register, or memory at a register: ff /2, mod 11 or 00 (no SIB, no disp) */
	__u8 mod = b[7] >> 6, rm = b[7] & 7;
	if (b[6] == 0xff && (b[7] & 0x38) == 0x10 && (mod == 3 || (mod == 0 && rm != 4 && rm != 5)))
		return 1;
	/* [reg+disp8], [sib+disp8] */
	if ((b[5] == 0xff && (b[6] & 0xf8) == 0x50 && (b[6] & 7) != 4) || (b[4] == 0xff && b[5] == 0x54))
		return 1;
	/* [rip+disp32], [reg+disp32] */
	return b[2] == 0xff && (b[3] == 0x15 || ((b[3] & 0xf8) == 0x90 && (b[3] & 7) != 4));
}

/* jvm_epilogue tells whether the instruction at pc is one of a compiled method's last,
 * as it releases its frame: pop rbp, the return poll (cmp rsp, [r15+disp32]; ja),
 * vzeroupper, or ret. */
__noinline int jvm_epilogue(__u64 pc)
{
	__u8 b[4];
	if (bpf_probe_read_user(b, sizeof(b), (void *)pc))
		return 0;
	return b[0] == 0x5d || b[0] == 0xc3 || (b[0] == 0x49 && b[1] == 0x3b && b[2] == 0xa7) ||
	       (b[0] == 0x0f && b[1] == 0x87) || (b[0] == 0xc5 && b[1] == 0xf8 && b[2] == 0x77);
}

/* jvm_frameless moves from a leaf frame that has not set up its frame, or has torn it
 * down: its return address is at sp, or above the caller's rbp it pushed. */
static __always_inline long jvm_frameless(struct jvm_walk *w)
{
	struct unwind_state *st = w->st;
	__u64 ra = 0, fp = 0;
	if (!bpf_probe_read_user(&ra, sizeof(ra), (void *)st->sp) && jvm_is_return(w->p, ra))
		return advance(st, st->sp + 8, ra, st->fp, 1);
	if (!bpf_probe_read_user(&ra, sizeof(ra), (void *)(st->sp + 8)) && jvm_is_return(w->p, ra) &&
	    !bpf_probe_read_user(&fp, sizeof(fp), (void *)st->sp))
		return advance(st, st->sp + 16, ra, fp, 1);
	return jvm_stop(w, JVM_BAD_FRAME, UNWIND_FP_BROKEN);
}

/* jvm_by_fp moves to the caller of a frame whose rbp is its frame pointer. */
static __always_inline long jvm_by_fp(struct jvm_walk *w)
{
	struct unwind_state *st = w->st;
	__u64 ra, fp;
	if (st->fp < st->sp || bpf_probe_read_user(&ra, sizeof(ra), (void *)(st->fp + 8)) ||
	    bpf_probe_read_user(&fp, sizeof(fp), (void *)st->fp))
		return jvm_stop(w, JVM_BAD_READ, UNWIND_FP_BROKEN);
	return advance(st, st->fp + 16, ra, fp, 1);
}

static __always_inline __u64 jvm_slot(struct jvm_scratch *s, __s16 off)
{
	__s32 o = off + JVM_SLOTS_BELOW;
	if (o < 0 || o > (JVM_SLOTS - 1) * 8)
		return 0;
	__u32 i = (__u32)o >> 3;
	if (i >= JVM_SLOTS)
		return 0;
	return s->slots[i];
}

/* jvm_interpreted records an interpreted frame and moves to its caller. */
static __always_inline long jvm_interpreted(struct jvm_walk *w)
{
	struct unwind_state *st = w->st;
	struct jvm_proc *p = w->p;
	struct jvm_scratch *s = w->s;
	__u64 fp = st->fp;
	int ok = fp >= st->sp && fp >= JVM_SLOTS_BELOW && !(fp >> 47) &&
		 !bpf_probe_read_user(s->slots, sizeof(s->slots), (void *)(fp - JVM_SLOTS_BELOW));
	__u64 method = 0, bcp = 0, sender_sp = 0, saved_fp = 0, ra = 0;
	if (ok) {
		method = jvm_slot(s, p->fp_method);
		bcp = jvm_slot(s, p->fp_bcp);
		sender_sp = jvm_slot(s, p->fp_sender_sp);
		saved_fp = s->slots[JVM_SLOTS_BELOW / 8];
		ra = s->slots[JVM_SLOTS_BELOW / 8 + 1];
		/* An interpreted method's caller is Java code or the call stub: in the code cache. */
		ok = method && !(method & 7) && !(method >> 47) && jvm_in_code(p, ra);
	}
	if (!ok) {
		/* rbp is not this frame's yet (the method's entry, before it set up its frame),
		 * or not an interpreter's frame at all: the interpreter's code it is, and where
		 * it returns to is at sp. */
		jvm_emit_code(w, st->pc, 0);
		if (st->pc_exact)
			return jvm_frameless(w);
		return jvm_stop(w, JVM_BAD_FRAME, UNWIND_FP_BROKEN);
	}
	__u64 bci = JVM_BCI_UNKNOWN, cm = 0;
	if (!bpf_probe_read_user(&cm, sizeof(cm), (void *)(method + p->method_const_method)) && cm) {
		__u64 code = cm + p->const_method_size;
		if (bcp >= code && bcp - code < JVM_BCI_UNKNOWN)
			bci = bcp - code;
	}
	jvm_emit(w, (__u64)JVM_KIND_INTERPRETED << JVM_KIND_BIT | (method >> JVM_METHOD_SHIFT) << JVM_BCI_BITS | bci);
	/* The caller's own stack pointer, before the call extended its stack with the
	 * arguments: a compiled caller's frame size counts from there. */
	__u64 sp = fp + 16;
	if (sender_sp >= sp && sender_sp - sp < JVM_MAX_SENDER_SP)
		sp = sender_sp;
	return advance(st, sp, ra, saved_fp, 1);
}

struct jvm_segmap {
	__u64 segmap;
	__u64 seg;
	__u32 end; /* JVM_COMPLETE: found */
	__u32 found;
};

/* A segment's byte in the map is how many segments back its block starts, in hops of at
 * most 254 (0: the block starts here); 0xff marks a free segment. */
static long jvm_segmap_step(__u32 i, void *ctx)
{
	struct jvm_segmap *m = ctx;
	__u8 hop = 0;
	if (bpf_probe_read_user(&hop, sizeof(hop), (void *)(m->segmap + m->seg))) {
		m->end = JVM_BAD_READ;
		return 1;
	}
	if (hop == 0) {
		m->found = 1;
		return 1;
	}
	if (hop == 0xff || hop > m->seg) {
		m->end = JVM_NO_BLOB;
		return 1;
	}
	m->seg -= hop;
	return 0;
}

/* jvm_blob_block returns where the block holding pc in heap h starts, or a jvm_end
 * (below JVM_END_MAX) when the segment map leads to none. A global function: the map's
 * loop is verified once, not at each of the walk's paths to it. */
__noinline __u64 jvm_blob_block(struct jvm_heap *h, __u64 pc)
{
	if (!h || pc < h->low)
		return JVM_NO_BLOB;
	__u32 log2 = h->log2_segment & 31;
	struct jvm_segmap m = {.segmap = h->segmap, .seg = (pc - h->low) >> log2};
	bpf_loop(JVM_SEGMAP_HOPS, jvm_segmap_step, &m, 0);
	if (!m.found)
		return m.end == JVM_COMPLETE ? JVM_NO_BLOB : m.end;
	return h->low + (m.seg << log2);
}

static __always_inline __s64 jvm_blob_s32(struct jvm_scratch *s, __u16 off)
{
	__u32 o = off;
	if (o > JVM_BLOB_READ - 4)
		return 0;
	return *(__s32 *)(s->blob + o);
}

static __always_inline __u64 jvm_blob_u64(struct jvm_scratch *s, __u16 off)
{
	__u32 o = off;
	if (o > JVM_BLOB_READ - 8)
		return 0;
	return *(__u64 *)(s->blob + o);
}

/* jvm_compiled records a frame of a code blob other than the interpreter and moves to
 * its caller. */
static __always_inline long jvm_compiled(struct jvm_walk *w)
{
	struct unwind_state *st = w->st;
	struct jvm_proc *p = w->p;
	struct jvm_scratch *s = w->s;
	__u64 pc = st->pc;
	struct jvm_heap *h = NULL;
	for (__u32 k = 0; k < JVM_MAX_HEAPS; k++) {
		if (k < p->heap_count && pc >= p->heaps[k].low && pc < p->heaps[k].end)
			h = &p->heaps[k];
	}
	if (!h) {
		jvm_emit_code(w, pc, 0);
		return jvm_stop(w, JVM_NO_HEAP, UNWIND_FP_BROKEN);
	}
	__u64 block = jvm_blob_block(h, pc);
	if (block < JVM_END_MAX) {
		jvm_emit_code(w, pc, 0);
		return jvm_stop(w, (__u32)block, UNWIND_FP_BROKEN);
	}
	__u64 blob = block + p->heap_block_size;
	__u32 n = p->blob_read;
	if (n > JVM_BLOB_READ)
		n = JVM_BLOB_READ;
	if (n < 8 || bpf_probe_read_user(s->blob, n, (void *)blob)) {
		jvm_emit_code(w, pc, 0);
		return jvm_stop(w, JVM_BAD_READ, UNWIND_BAD_READ);
	}
	__s64 size = jvm_blob_s32(s, p->blob_size), frame_size = jvm_blob_s32(s, p->blob_frame_size);
	__u64 code_begin = p->code_begin_is_pointer ? jvm_blob_u64(s, p->blob_code_begin)
						    : blob + jvm_blob_s32(s, p->blob_code_begin);
	__s64 complete = jvm_blob_s32(s, p->blob_frame_complete);
	if (p->frame_complete_16)
		complete = (__s16)complete;
	if (size <= 0 || pc >= blob + size || pc < code_begin) {
		jvm_emit_code(w, pc, 0);
		return jvm_stop(w, JVM_NO_BLOB, UNWIND_FP_BROKEN);
	}
	jvm_emit_code(w, pc, (__u32)jvm_blob_s32(s, p->nmethod_compile_id));
	int leaf = st->pc_exact;
	if (frame_size > 0 && frame_size < JVM_MAX_FRAME_WORDS) {
		/* A fixed frame, once its prologue set it up. */
		if (leaf && ((complete >= 0 && pc - code_begin < (__u64)complete) || jvm_epilogue(pc)))
			return jvm_frameless(w);
		__u64 sender = st->sp + frame_size * 8, ra = 0, fp = 0;
		if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(sender - 8)) ||
		    bpf_probe_read_user(&fp, sizeof(fp), (void *)(sender - 16)))
			return leaf ? jvm_frameless(w) : jvm_stop(w, JVM_BAD_READ, UNWIND_BAD_READ);
		/* In the leaf, the epilogue may have torn the frame down already. */
		if (leaf ? !jvm_is_return(p, ra) : !jvm_in_code(p, ra))
			return leaf ? jvm_frameless(w) : jvm_stop(w, JVM_BAD_FRAME, UNWIND_FP_BROKEN);
		return advance(st, sender, ra, fp, 1);
	}
	/* No fixed frame: a stub's, by rbp once it set up one. In the leaf, a return address
	 * at sp says it has not (or it never does: a jump through a vtable stub). */
	if (leaf) {
		__u64 ra = 0;
		if (!bpf_probe_read_user(&ra, sizeof(ra), (void *)st->sp) && jvm_is_return(p, ra))
			return advance(st, st->sp + 8, ra, st->fp, 1);
	}
	return jvm_by_fp(w);
}

/* jvm_step records the frame at st->pc, in the code cache, and moves to its caller: it
 * returns 1 when the walk ends, with the jvm_end above bit 8. A global function, verified
 * once on its own: inlined into the loop's callback, its many branches were explored at
 * each of the callback's verified iterations. */
__noinline long jvm_step(struct unwind_state *st, struct user_frames *frames, struct jvm_proc *p, struct jvm_scratch *s)
{
	if (!st || !frames || !p || !s)
		return 1 | (long)JVM_BAD_READ << 8;
	struct jvm_walk w = {.st = st, .frames = frames, .p = p, .s = s};
	long stop = st->pc >= p->interp_start && st->pc < p->interp_end ? jvm_interpreted(&w) : jvm_compiled(&w);
	return stop | (long)w.end << 8;
}

static long jvm_frame_step(__u32 i, void *ctx)
{
	struct jvm_walk *w = ctx;
	struct unwind_state *st = w->st;
	struct jvm_proc *p = w->p;
	if (st->done)
		return 1;
	if (!jvm_in_code(p, st->pc))
		return 1; /* native code again: the native walk goes on */
	if (st->n >= MAX_USER_DEPTH) {
		w->end = JVM_TRUNCATED;
		finish(st, UNWIND_TRUNCATED);
		return 1;
	}
	st->frameless = 0;
	long r = jvm_step(st, w->frames, p, w->s);
	w->end = (__u32)(r >> 8);
	return r & 1;
}

/* jvm_frames walks the Java frames from the frame at st->pc, which lies in the code
 * cache (not yet recorded), records them, and leaves st at the first frame outside it. It
 * returns 1 when the walk ends there, as walker_step does. Of pid and exec_id, which the
 * JIT runtimes' walkers are given (runtimes.h), it checks only that p is of the walk's
 * exec, as the dispatch did. */
__noinline long jvm_frames(struct unwind_state *st, struct user_frames *frames, struct jvm_proc *p, __u32 pid, __u64 exec_id)
{
	if (!st || !frames || !p || !pid || (p->exec_id && p->exec_id != exec_id))
		return 1;
	__u32 zero = 0;
	struct jvm_scratch *s = bpf_map_lookup_elem(&jvm_scratch_map, &zero);
	if (!s)
		return 1;
	struct jvm_walk w = {.st = st, .frames = frames, .p = p, .s = s};
	bpf_loop(MAX_USER_DEPTH, jvm_frame_step, &w, 0);
	__u32 end = w.end;
	if (end == JVM_COMPLETE && st->done && st->end == UNWIND_NOT_ABOVE)
		end = JVM_BAD_FRAME;
	if (end >= JVM_END_MAX)
		end = JVM_BAD_READ;
	__u64 *c = bpf_map_lookup_elem(&jvm_counters, &end);
	if (c)
		(*c)++;
	return st->done;
}

#endif /* ARCH_TABLE_UNWIND && __TARGET_ARCH_x86 */
#endif
