/* What the walkers of the runtimes whose frames are in their own state do alike
 * (SONDE_STATE_RUNTIMES: python.h, php.h, ruby.h): merge the sample's native frames with
 * the runtime's chain of frames, replacing each activation of the runtime's loop on the
 * native stack by the span of the chain it runs. Each walker keeps a struct state_walk in
 * its per-CPU scratch (s->st) beside a copy of the native frames (s->native), says which
 * native frames are its loop's, and steps through its own chain. */
#ifndef SONDE_STATEWALK_H
#define SONDE_STATEWALK_H

struct state_walk {
	__u64 frame;    /* the next frame of the chain to look at; 0 at its end */
	__u64 exec_pc;  /* the native frame of the open activation */
	__u32 in, n_in; /* the next native frame and how many there are */
	__u32 n_out;
	__u32 walked;   /* chain frames read, bounded by the runtime */
	__u32 end;      /* the runtime's enum of how its walk ended */
	__u8 open;      /* an activation's span is being emitted */
	__u8 emitted;   /* frames the open activation emitted */
	__u8 tail;      /* the native walk is over: what is left of the chain goes at the root */
	__u8 pad;
};

static __always_inline void state_emit(struct state_walk *st, __u64 *out, __u64 v)
{
	if (st->n_out < MAX_USER_DEPTH)
		out[st->n_out & (MAX_USER_DEPTH - 1)] = v;
	st->n_out++;
}

/* state_close ends the open activation: its native frame stays if it emitted nothing. */
static __always_inline void state_close(struct state_walk *st, __u64 *out)
{
	if (!st->emitted && !st->tail)
		state_emit(st, out, st->exec_pc);
	st->open = 0;
}

/* STATE_MERGE_STEP defines name_merge_step, the bpf_loop callback of a walk (struct
 * walk_type: proc, s with st and native, out): a native frame where in_region(proc, pc)
 * opens an activation, whose chain frames step(w) emits until it closes it; a native
 * frame where drop(w, pc) is left out (the loop of a runtime whose activation its caller
 * stands for: CRuby's vm_exec_core under vm_exec); other native frames are kept. When the
 * native walk stopped short (tail), what is left of the chain goes at the root. */
#define STATE_KEEP_ALL(w, pc) 0
#define STATE_MERGE_STEP(name, walk_type, in_region, drop, step, truncated) \
	static long name##_merge_step(__u32 i, void *ctx)              \
	{                                                              \
		struct walk_type *w = ctx;                             \
		struct state_walk *st = &w->s->st;                     \
		if (st->n_out >= MAX_USER_DEPTH) {                     \
			if (st->frame || st->in < st->n_in)            \
				st->end = truncated;                   \
			return 1;                                      \
		}                                                      \
		if (st->open)                                          \
			return step(w);                                \
		if (st->in >= st->n_in) {                              \
			if (!st->tail || !st->frame)                   \
				return 1;                              \
			st->open = 1;                                  \
			return 0;                                      \
		}                                                      \
		__u64 pc = w->s->native[st->in & (MAX_USER_DEPTH - 1)]; \
		st->in++;                                              \
		if (st->frame && drop(w, pc))                          \
			return 0;                                      \
		if (st->frame && in_region(w->proc, pc)) {             \
			st->open = 1;                                  \
			st->emitted = 0;                               \
			st->exec_pc = pc;                              \
			return 0;                                      \
		}                                                      \
		state_emit(st, w->out, pc);                            \
		return 0;                                              \
	}

#endif
