/* The table-driven user-stack walker.
 *
 * sampler.bpf.c includes it with the BPF helpers; bpf/testdata/walker.c compiles the very
 * same code natively, with stand-ins for the helpers, so tests can run it on recorded and
 * synthetic stacks next to package unwind's Go model of it. The includer defines:
 *
 *   int   walker_read_user(__u64 *dst, __u64 addr)     0 on success
 *   void *walker_table(__u32 table_id)                 the rows of a file's table, or NULL
 *   struct unwind_row *walker_row(void *table, __u32 i)
 *   long  walker_loop(__u32 n, long (*fn)(__u32, void *), void *ctx)
 *
 * and includes types.h and arch.h first. */
#ifndef SONDE_UNWINDER_H
#define SONDE_UNWINDER_H

#if ARCH_TABLE_UNWIND

struct unwind_state {
	__u64 *frames;          /* MAX_USER_DEPTH slots, leaf first */
	struct proc_info *proc; /* looked up once per sample; NULL: walk by frame pointer */
	__u64 pc, sp, fp;
	__u32 n;
	__u32 end;
	__u8 used_fp; /* a frame was walked by frame pointer for lack of a table */
	__u8 done;
	/* pc is the interrupted instruction, not a return address: the leaf, or the frame a
	 * signal interrupted. Return addresses are looked up one byte back, inside the call. */
	__u8 pc_exact;
};

/* Binary searches run as bpf_loop callbacks: the verifier checks a callback once, where
 * an unrolled search is explored branch by branch and exceeds its instruction budget. */
struct search {
	__u64 key;
	struct proc_info *proc; /* mapping_search_step: whose mappings */
	void *table;            /* row_search_step: which file's rows */
	__u32 lo, hi;
};

static long mapping_search_step(__u32 i, void *ctx)
{
	struct search *s = ctx;
	struct proc_info *proc = s->proc;
	if (s->lo >= s->hi || !proc)
		return 1;
	__u32 mid = s->lo + (s->hi - s->lo) / 2;
	if (proc->maps[mid & (MAX_PROC_MAPPINGS - 1)].start <= s->key)
		s->lo = mid + 1;
	else
		s->hi = mid;
	return 0;
}

/* find_mapping returns the mapping of proc covering pc. */
static __always_inline struct exec_mapping *find_mapping(struct proc_info *proc, __u64 pc)
{
	struct search s = {.key = pc, .proc = proc, .lo = 0, .hi = proc->count};
	if (s.hi > MAX_PROC_MAPPINGS)
		s.hi = MAX_PROC_MAPPINGS;
	walker_loop(10, mapping_search_step, &s); /* 2^9 > MAX_PROC_MAPPINGS */
	if (s.lo == 0 || s.lo > MAX_PROC_MAPPINGS)
		return NULL;
	struct exec_mapping *m = &proc->maps[(s.lo - 1) & (MAX_PROC_MAPPINGS - 1)];
	if (pc >= m->end || pc < m->start)
		return NULL;
	return m;
}

static long row_search_step(__u32 i, void *ctx)
{
	struct search *s = ctx;
	if (s->lo >= s->hi)
		return 1;
	__u32 mid = s->lo + (s->hi - s->lo) / 2;
	struct unwind_row *r = walker_row(s->table, mid);
	if (!r)
		return 1;
	if (r->pc <= s->key)
		s->lo = mid + 1;
	else
		s->hi = mid;
	return 0;
}

/* find_row returns the last of a table's count rows whose pc <= vaddr. */
static __always_inline struct unwind_row *find_row(void *table, __u32 count, __u32 vaddr)
{
	struct search s = {.key = vaddr, .table = table, .lo = 0, .hi = count};
	walker_loop(25, row_search_step, &s); /* tables hold fewer than 2^24 rows */
	if (s.lo == 0)
		return NULL;
	return walker_row(table, s.lo - 1);
}

static __always_inline long finish(struct unwind_state *st, __u32 end)
{
	st->end = end;
	st->done = 1;
	return 1; /* stops the loop */
}

/* unwind_step records the current frame and moves to its caller. */
static long unwind_step(__u32 i, void *ctx)
{
	struct unwind_state *st = ctx;

	if (st->pc == 0)
		return finish(st, UNWIND_COMPLETE);
	if (st->n >= MAX_USER_DEPTH)
		return finish(st, UNWIND_TRUNCATED);
	st->frames[st->n & (MAX_USER_DEPTH - 1)] = st->pc;
	st->n++;

	struct unwind_row *row = NULL;
	struct proc_info *proc = st->proc;
	if (proc) {
		struct exec_mapping *m = find_mapping(proc, st->pc);
		if (m && m->rows_count) {
			void *table = walker_table(m->table_id);
			if (!table)
				return finish(st, UNWIND_INVALID);
			/* A return address points after the call; the call itself belongs to the caller's row. */
			__u64 vaddr = st->pc - m->bias - (st->pc_exact ? 0 : 1);
			row = find_row(table, m->rows_count, (__u32)vaddr);
			if (!row)
				return finish(st, UNWIND_INVALID);
		}
	}

	__u64 cfa, ra, fp = st->fp;
	if (!row) {
		/* No table: trust the frame pointer, as bpf_get_stack would. */
		st->used_fp = 1;
		if (st->fp == 0)
			return finish(st, UNWIND_NO_TABLE);
		if (walker_read_user(&ra, st->fp + 8) || walker_read_user(&fp, st->fp))
			return finish(st, UNWIND_NO_TABLE);
		cfa = st->fp + 16;
	} else {
		switch (row->cfa_rule) {
		case CFA_SP:
			cfa = st->sp + row->cfa_offset;
			break;
		case CFA_FP:
			cfa = st->fp + row->cfa_offset;
			break;
		case CFA_PLT:
			cfa = st->sp + 8 + ((st->pc & 15) >= 11 ? 8 : 0);
			break;
		case CFA_SIGNAL:
			if (walker_read_user(&ra, st->sp + UCONTEXT_PC) || walker_read_user(&cfa, st->sp + UCONTEXT_SP) ||
			    walker_read_user(&fp, st->sp + UCONTEXT_FP))
				return finish(st, UNWIND_BAD_READ);
			st->pc = ra;
			st->sp = cfa;
			st->fp = fp;
			st->pc_exact = 1;
			return 0;
		case CFA_END_OF_STACK:
			return finish(st, UNWIND_COMPLETE);
		default:
			return finish(st, UNWIND_INVALID);
		}
		if (walker_read_user(&ra, cfa - 8))
			return finish(st, UNWIND_BAD_READ);
		if (row->fp_rule == FP_AT_CFA) {
			if (walker_read_user(&fp, cfa + row->fp_offset))
				return finish(st, UNWIND_BAD_READ);
		} else if (row->fp_rule == FP_INVALID) {
			fp = 0;
		}
	}
	/* The stack grows down: a caller's frame lies above its callee's. */
	if (cfa <= st->sp && st->n > 1)
		return finish(st, UNWIND_INVALID);
	st->pc_exact = 0;
	st->pc = ra;
	st->sp = cfa;
	st->fp = fp;
	return 0;
}

/* walk_user walks a user stack from its leaf registers into frames and returns how many it
 * wrote; *end says how the walk ended. */
static __always_inline __u32 walk_user(__u64 *frames, struct proc_info *proc, __u64 pc, __u64 sp, __u64 fp,
				       __u32 *end)
{
	struct unwind_state st = {
		.frames = frames,
		.proc = proc,
		.pc = pc,
		.sp = sp,
		.fp = fp,
		.pc_exact = 1,
	};
	walker_loop(MAX_USER_DEPTH + 1, unwind_step, &st);
	if (!st.done)
		st.end = UNWIND_TRUNCATED;
	else if (st.end == UNWIND_COMPLETE && st.used_fp)
		st.end = UNWIND_NO_TABLE;
	*end = st.end;
	return st.n;
}

#endif /* ARCH_TABLE_UNWIND */
#endif
