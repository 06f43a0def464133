/* The table-driven user-stack walker.
 *
 * sampler.bpf.c includes it with the BPF helpers; bpf/testdata/walker.c compiles the very
 * same code natively, with stand-ins for the helpers, so tests can run it on recorded and
 * synthetic stacks next to package unwind's Go model of it. The includer defines:
 *
 *   int   walker_read_user(__u64 *dst, __u64 addr)     0 on success
 *   int   walker_read_pair(__u64 dst[2], __u64 addr)   two words at once, 0 on success
 *   int   walker_read_kernel(__u64 *dst, __u64 addr)   0 on success; reads the leaf's pt_regs
 *   void *walker_table(__u32 table_id)                 the rows of a file's table, or NULL
 *   struct unwind_row *walker_row(void *table, __u32 i)
 *   struct go_runtime *walker_go_runtime(__u32 table_id)  a Go binary's runtime layout, or NULL
 *   long  walker_loop(__u32 n, long (*fn)(__u32, void *), void *ctx)
 *
 * and includes types.h and arch.h first. */
#ifndef SONDE_UNWINDER_H
#define SONDE_UNWINDER_H

#if ARCH_TABLE_UNWIND

/* The Go runtime's goroutine states (runtime2.go): being copied, and the bit the
 * garbage collector sets while it scans one. */
#define G_COPYSTACK 8
#define G_SCAN 0x1000

#ifndef barrier_var
#define barrier_var(var) asm volatile("" : "+r"(var))
#endif

/* Where the registers of the current frame beyond pc, sp and fp can be read: only the
 * frame the thread was interrupted in knows them. */
#define REGS_NONE 0
#define REGS_KERNEL 1   /* the leaf: the task's pt_regs, at a kernel address */
#define REGS_UCONTEXT 2 /* the frame a signal interrupted: the ucontext its handler got */

/* Where the walk writes the frames, leaf first. */
struct user_frames {
	__u64 pc[MAX_USER_DEPTH];
};

struct unwind_state {
	__u64 pc, sp, fp;
	__u64 regs; /* the address REGS_KERNEL or REGS_UCONTEXT names */
	__u64 tls;  /* the thread pointer */
	__u32 n;
	__u32 end;
	__u8 used_fp; /* a frame was walked by frame pointer: code without a table */
	__u8 done;
	/* pc is the interrupted instruction, not a return address: the leaf, or the frame a
	 * signal interrupted. Return addresses are looked up one byte back, inside the call. */
	__u8 pc_exact;
	__u8 regs_kind;
	/* The frame's function was stopped in its prologue before it set up a frame (Go's
	 * morestack): its return address is at sp. */
	__u8 frameless;
	/* The frame's pc was read from sp of an interrupted routine no table describes
	 * (no_row): kept only if a table describes it. */
	__u8 guessed;
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

/* row_index_entry returns entry k of a table's index (struct row_index), or -1. */
static __always_inline __s64 row_index_entry(void *table, __u32 count, __u32 k)
{
	__u32 *slot = (__u32 *)walker_row(table, count + 1 + (k >> 2));
	if (!slot)
		return -1;
	return slot[k & 3];
}

/* find_row returns the last of a table's count rows whose pc <= vaddr. A table's index
 * narrows the search to vaddr's page: from the row in effect at its start to the one in
 * effect at the next page's. */
static __always_inline struct unwind_row *find_row(void *table, __u32 count, __u32 vaddr)
{
	struct search s = {.key = vaddr, .table = table, .lo = 0, .hi = count};
	struct row_index *ix = (struct row_index *)walker_row(table, count);
	if (ix && ix->pages) {
		__u32 page = vaddr >> (ix->shift & 31);
		if (page < ix->first_page)
			return NULL; /* below the first row */
		page -= ix->first_page;
		if (page > ix->pages)
			page = ix->pages;
		__s64 lo = row_index_entry(table, count, page);
		__s64 hi = page < ix->pages ? row_index_entry(table, count, page + 1) + 1 : count;
		if (lo >= 0 && hi > lo && hi <= count) {
			s.lo = lo;
			s.hi = hi;
		}
	}
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

/* advance moves the walk to the caller. Within one stack a caller's frame lies above its
 * callee's, as the stack grows down; only the switches between stacks may go elsewhere. */
static __always_inline long advance(struct unwind_state *st, __u64 cfa, __u64 ra, __u64 fp, int same_stack)
{
	if (same_stack && cfa <= st->sp && st->n > 1)
		return finish(st, UNWIND_NOT_ABOVE);
	st->pc_exact = 0;
	st->regs_kind = REGS_NONE;
	st->pc = ra;
	st->sp = cfa;
	st->fp = fp;
	return 0;
}

/* no_row moves from a frame no row describes. An interrupted pc there lies in a file with a
 * table but outside every function it describes: hand-written assembly without call frame
 * information, such as HotSpot's copy routines. Most such routines are leaves that push
 * nothing and keep their return address at sp: the walk goes on from there, a guess that
 * the next step keeps only if a row describes the address, and otherwise takes back, so
 * that the walk ends where it would have without it. A return address outside every
 * function is a broken walk, and ends it. */
static __always_inline long no_row(struct unwind_state *st)
{
	__u64 ra;
	if (st->guessed) {
		if (st->n > 0)
			st->n--;
		return finish(st, UNWIND_NO_ROW);
	}
	if (!st->pc_exact || walker_read_user(&ra, st->sp))
		return finish(st, UNWIND_NO_ROW);
	st->guessed = 1;
	return advance(st, st->sp + 8, ra, st->fp, 1);
}

/* frame_reg reads a general-purpose register of the current frame by its DWARF number; it
 * returns 0, or how the walk ends for want of it. */
static __always_inline __u32 frame_reg(struct unwind_state *st, __u32 reg, __u64 *v)
{
	if (reg == DWARF_SP) {
		*v = st->sp;
		return 0;
	}
	if (reg == DWARF_FP) {
		*v = st->fp;
		return 0;
	}
	if (reg >= DWARF_GPRS)
		return UNWIND_REGISTER;
	/* Keeps the compiler from dropping the mask below as redundant: the verifier needs it. */
	barrier_var(reg);
	if (st->regs_kind == REGS_KERNEL)
		return walker_read_kernel(v, st->regs + ptregs_offset[reg & (DWARF_GPRS - 1)]) ? UNWIND_REGISTER : 0;
	if (st->regs_kind == REGS_UCONTEXT)
		return walker_read_user(v, st->regs + ucontext_offset[reg & (DWARF_GPRS - 1)]) ? UNWIND_BAD_READ : 0;
	return UNWIND_REGISTER;
}

/* go_step follows a Go runtime function that switches stacks (or ends them) to the frame
 * that called it, on the goroutine's stack or on g0's. Go code has no unwind table: Go's
 * frames are walked by frame pointer, and so are the switches counted. */
static __always_inline long go_step(struct unwind_state *st, __u32 kind, __u32 table_id)
{
	__u64 ra, fp, sp, g, v;
	st->used_fp = 1;
	if (kind == GO_FUNC_TOP)
		return finish(st, UNWIND_COMPLETE);
	if (kind == GO_FUNC_FP_SWITCH) {
		/* The function set up its frame on one stack and called on another: cgocallback on
		 * g0 before it moved to the goroutine's stack (its frame pointer leads back to the C
		 * code that called Go), time.now and nanotime1 on the goroutine's before they moved
		 * to g0 for the vDSO. */
		__u64 pair[2];
		if (walker_read_pair(pair, st->fp))
			return finish(st, UNWIND_GO_SWITCH);
		return advance(st, st->fp + 16, pair[1], pair[0], 0);
	}
	struct go_runtime *rt = walker_go_runtime(table_id);
	if (!rt)
		return finish(st, UNWIND_GO_SWITCH);
	if (kind == GO_FUNC_ASMCGOCALL) {
		/* On g0, asmcgocall keeps the goroutine and its stack depth (the goroutine's stack may
		 * move while C runs); called on g0 already, no goroutine and its own entry SP. */
		if (walker_read_user(&g, st->sp + rt->cgo_g) || walker_read_user(&sp, st->sp + rt->cgo_depth))
			return finish(st, UNWIND_GO_SWITCH);
		if (g) {
			if (walker_read_user(&v, g + rt->g_stack_hi))
				return finish(st, UNWIND_GO_SWITCH);
			sp = v - sp;
		}
		if (walker_read_user(&ra, sp))
			return finish(st, UNWIND_GO_SWITCH);
		return advance(st, sp + 8, ra, st->fp, 0);
	}
	/* The goroutine the thread runs for: the g in TLS may be g0 or the signal g, both of
	 * which belong to the same m. */
	__u64 m, curg;
	if (walker_read_user(&g, st->tls + rt->tls_g) || walker_read_user(&m, g + rt->g_m) ||
	    walker_read_user(&curg, m + rt->m_curg))
		return finish(st, UNWIND_GO_SWITCH);
	/* No goroutine: newstack preempted the one whose stack grew, and the scheduler runs
	 * for none. Go's own tracebacks end there too. */
	if (!curg)
		return finish(st, kind == GO_FUNC_MORESTACK ? UNWIND_COMPLETE : UNWIND_GO_SWITCH);
	__u64 sched = curg + rt->g_sched;
	if (walker_read_user(&sp, sched + rt->gobuf_sp) || walker_read_user(&fp, sched + rt->gobuf_bp))
		return finish(st, UNWIND_GO_SWITCH);
	if (kind == GO_FUNC_SYSTEMSTACK) {
		/* The assembler gives systemstack a frame pointer of its own (it makes calls), and
		 * it saves its registers in sched right after: sched.bp is then sched.sp, where its
		 * caller's frame pointer lies, below the return address. A build where it had no
		 * frame left the caller's frame pointer in sched.bp, and the return address at
		 * sched.sp. */
		if (sp == fp) {
			__u64 pair[2];
			if (walker_read_pair(pair, fp))
				return finish(st, UNWIND_GO_SWITCH);
			return advance(st, fp + 16, pair[1], pair[0], 0);
		}
		if (walker_read_user(&ra, sp))
			return finish(st, UNWIND_GO_SWITCH);
		return advance(st, sp + 8, ra, fp, 0);
	}
	if (kind == GO_FUNC_MORESTACK) {
		/* While newstack copies the goroutine's stack, its frame pointers lead from the new
		 * copy to the old: the goroutine's frames are in no state to be walked. */
		if (walker_read_user(&v, curg + rt->g_status))
			return finish(st, UNWIND_GO_SWITCH);
		if ((v & 0xffffffff & ~G_SCAN) == G_COPYSTACK)
			return finish(st, UNWIND_COMPLETE);
		if (walker_read_user(&ra, sched + rt->gobuf_pc))
			return finish(st, UNWIND_GO_SWITCH);
		long stop = advance(st, sp, ra, fp, 0);
		st->frameless = 1;
		return stop;
	}
	return finish(st, UNWIND_INVALID);
}

/* fp_step moves to the caller of a frame without a table, by its frame pointer as
 * bpf_get_stack would; a zero frame pointer is the ABI's mark of the outermost frame. */
static __always_inline long fp_step(struct unwind_state *st)
{
	__u64 ra, fp = st->fp;
	st->used_fp = 1;
	if (st->frameless) {
		/* Stopped in its prologue before it set up a frame: the return address is at sp. */
		st->frameless = 0;
		if (walker_read_user(&ra, st->sp))
			return finish(st, UNWIND_FP_BROKEN);
		return advance(st, st->sp + 8, ra, fp, 1);
	}
	if (st->fp == 0)
		return finish(st, UNWIND_COMPLETE);
	/* The saved frame pointer and the return address above it, in one read. */
	__u64 pair[2];
	if (walker_read_pair(pair, st->fp))
		return finish(st, UNWIND_FP_BROKEN);
	return advance(st, st->fp + 16, pair[1], pair[0], 1);
}

/* walker_step's verdict for a frame of code without a table, or one its table says is
 * walked by frame pointer: recorded, not yet moved from. */
#define WALK_NO_TABLE 2

/* walker_step records the current frame and moves to its caller; it returns 1 when the
 * walk ends, or WALK_NO_TABLE for a frame of code no table describes. It is a global function so that the verifier checks it once, on its own, for
 * any state the walk may be in: inlined into the loop's callback, each of the walk's
 * branches multiplies the states the verifier follows, and a small change to the walker
 * (even to the values of its end codes) takes that from thousands to a million. */
__attribute__((noinline)) long walker_step(struct unwind_state *st, struct user_frames *frames, struct proc_info *proc,
					  struct row_memo *memo)
{
	if (!st || !frames)
		return 1;
	if (st->pc == 0)
		return finish(st, UNWIND_COMPLETE);
	if (st->n >= MAX_USER_DEPTH)
		return finish(st, UNWIND_TRUNCATED);
	frames->pc[st->n & (MAX_USER_DEPTH - 1)] = st->pc;
	st->n++;

	struct unwind_row r, *row = NULL;
	__u32 table_id = 0;
	if (proc) {
		__u64 pc = st->pc;
		/* The set's entry for the pc, if any, up to date or not; else the one to replace. */
		struct row_memo_slot *set = NULL, *ms = NULL;
		__u32 now = 0, victim = 0;
		if (memo) {
			now = ++memo->clock;
			set = &memo->slot[((pc ^ (pc >> 8)) & (ROW_MEMO_SETS - 1)) * ROW_MEMO_WAYS];
			for (__u32 i = 0; i < ROW_MEMO_WAYS; i++) {
				if (set[i].pc == pc && set[i].exact == st->pc_exact && set[i].kind != ROW_MEMO_EMPTY) {
					ms = &set[i];
					break;
				}
				if (set[i].used < set[victim & (ROW_MEMO_WAYS - 1)].used)
					victim = i;
			}
			if (ms)
				ms->used = now;
		}
		if (ms && ms->gen == proc->gen) {
			if (ms->kind == ROW_MEMO_ROW) {
				r = ms->row;
				row = &r;
				table_id = ms->table_id;
			}
		} else {
			struct exec_mapping *m = find_mapping(proc, pc);
			if (m && m->rows_count) {
				void *table = walker_table(m->table_id);
				if (!table)
					return finish(st, UNWIND_TABLE_GONE);
				/* A return address points after the call; the call itself belongs to the caller's row. */
				__u64 vaddr = pc - m->bias - (st->pc_exact ? 0 : 1);
				struct unwind_row *found = find_row(table, m->rows_count, (__u32)vaddr);
				if (!found)
					return no_row(st);
				r = *found;
				row = &r;
				table_id = m->table_id;
			}
			if (set && !ms) {
				ms = &set[victim & (ROW_MEMO_WAYS - 1)];
				ms->used = now;
			}
			if (ms) {
				ms->pc = pc;
				ms->gen = proc->gen;
				ms->exact = st->pc_exact;
				ms->kind = row ? ROW_MEMO_ROW : ROW_MEMO_NO_TABLE;
				ms->table_id = table_id;
				if (row)
					ms->row = r;
			}
		}
	}
	if (st->guessed) {
		if (!row || row->cfa_rule == CFA_INVALID)
			return no_row(st);
		st->guessed = 0;
	}
	/* Code without a table: a runtime's JIT may know its frames (walker_no_table); a
	 * process the kernel knows nothing of is walked by frame pointer throughout. */
	if (!row)
		return proc ? WALK_NO_TABLE : fp_step(st);
	__u32 rule = row->cfa_rule;
	if (rule == CFA_GO && !st->pc_exact)
		return go_step(st, row->cfa_reg, table_id);
	/* Code walked by frame pointer: a runtime's (V8's builtins in node's text) whose walker
	 * may know more of its frames than a return address. */
	if (rule == CFA_FRAME_POINTER)
		return WALK_NO_TABLE;
	/* A Go switch interrupted in itself rather than returned to: its frame pointer leads on. */
	if (rule == CFA_GO)
		return fp_step(st);
	st->frameless = 0;

	__u64 cfa, ra, fp = st->fp, v, x;
	__u32 err;
	switch (rule) {
	case CFA_SP:
		cfa = st->sp + row->cfa_offset;
		break;
	case CFA_FP:
		cfa = st->fp + row->cfa_offset;
		break;
	case CFA_REG:
		if ((err = frame_reg(st, row->cfa_reg, &cfa)))
			return finish(st, err);
		cfa += row->cfa_offset;
		break;
	case CFA_DEREF:
		if ((err = frame_reg(st, row->cfa_reg, &v)))
			return finish(st, err);
		v += row->cfa_offset;
		if (row->cfa_index & CFA_INDEX) {
			if ((err = frame_reg(st, row->cfa_index & 15, &x)))
				return finish(st, err);
			v += x << ((row->cfa_index >> 4) & 3);
		}
		if (walker_read_user(&cfa, v))
			return finish(st, UNWIND_BAD_READ);
		cfa += row->cfa_post;
		break;
	case CFA_PLT:
		cfa = st->sp + 8 + ((st->pc & 15) >= 11 ? 8 : 0);
		break;
	case CFA_SIGNAL:
		if (walker_read_user(&ra, st->sp + UCONTEXT_PC) || walker_read_user(&cfa, st->sp + UCONTEXT_SP) ||
		    walker_read_user(&fp, st->sp + UCONTEXT_FP))
			return finish(st, UNWIND_BAD_READ);
		/* The interrupted frame's registers are all in the ucontext, its PC exact, and its
		 * stack anywhere: the handler may run on a stack of its own. */
		st->regs = st->sp;
		st->regs_kind = REGS_UCONTEXT;
		st->pc = ra;
		st->sp = cfa;
		st->fp = fp;
		st->pc_exact = 1;
		return 0;
	case CFA_END_OF_STACK:
		return finish(st, UNWIND_COMPLETE);
	case CFA_INVALID:
		return no_row(st);
	case CFA_EXPRESSION:
		return finish(st, UNWIND_CFA_EXPRESSION);
	case CFA_RA_ELSEWHERE:
		return finish(st, UNWIND_RA_RULE);
	default:
		return finish(st, UNWIND_INVALID);
	}
	if (row->fp_rule == FP_AT_CFA && row->fp_offset == -16) {
		/* The frame pointer pushed right after the call (most code that saves it): both
		 * words in one read. */
		__u64 pair[2];
		if (walker_read_pair(pair, cfa - 16))
			return finish(st, UNWIND_BAD_READ);
		return advance(st, cfa, pair[1], pair[0], 1);
	}
	if (walker_read_user(&ra, cfa - 8))
		return finish(st, UNWIND_BAD_READ);
	switch (row->fp_rule) {
	case FP_AT_CFA:
		if (walker_read_user(&fp, cfa + row->fp_offset))
			return finish(st, UNWIND_BAD_READ);
		break;
	case FP_AT_FP:
		if (walker_read_user(&fp, st->fp + row->fp_offset))
			return finish(st, UNWIND_BAD_READ);
		break;
	case FP_AT_SP:
		if (walker_read_user(&fp, st->sp + row->fp_offset))
			return finish(st, UNWIND_BAD_READ);
		break;
	case FP_INVALID:
		fp = 0;
		break;
	}
	return advance(st, cfa, ra, fp, 1);
}

/* walk is the loop's context. The pointers stay outside the state walker_step is given:
 * after a call to a global function the verifier knows nothing of the memory it was
 * passed, and a pointer read from there would be a number. */
struct walk {
	struct user_frames *frames;
	struct proc_info *proc; /* looked up once per sample; NULL: walk by frame pointer */
	struct row_memo *memo;  /* this CPU's, or NULL */
	__u64 exec_id;          /* whose stack it is, for walker_no_table */
	__u32 pid;
	__u16 no_jit;           /* walker_no_table's: a bit per JIT runtime it found the process does not run */
	__u16 pad;
	struct unwind_state st;
};

/* walker_no_table moves from a frame of code without a table (or walked by frame pointer),
 * which walker_step recorded: the includer defines it, to hand a JIT's code to its
 * runtime's walker and the rest to fp_step. It returns what walker_step would. */
static long walker_no_table(struct walk *w);

static long unwind_step(__u32 i, void *ctx)
{
	struct walk *w = ctx;
	long r = walker_step(&w->st, w->frames, w->proc, w->memo);
	if (r == WALK_NO_TABLE)
		r = walker_no_table(w);
	return r ? 1 : 0;
}

/* walk_user walks a user stack of process pid (as of its exec exec_id) from its leaf
 * registers into frames and returns how many it wrote; *end says how the walk ended. regs
 * is the address of the task's pt_regs, for the leaf's other registers; tls its thread
 * pointer; memo, when not NULL, this CPU's memo of rows found (struct row_memo). */
static __always_inline __u32 walk_user(struct user_frames *frames, struct proc_info *proc, struct row_memo *memo, __u32 pid,
				       __u64 exec_id, __u64 pc, __u64 sp, __u64 fp, __u64 regs, __u64 tls, __u32 *end)
{
	struct walk w = {
		.frames = frames,
		.proc = proc,
		.memo = memo,
		.exec_id = exec_id,
		.pid = pid,
		.st =
			{
				.pc = pc,
				.sp = sp,
				.fp = fp,
				.regs = regs,
				.tls = tls,
				.pc_exact = 1,
				.regs_kind = REGS_KERNEL,
			},
	};
	walker_loop(MAX_USER_DEPTH + 1, unwind_step, &w);
	if (!w.st.done)
		w.st.end = UNWIND_TRUNCATED;
	else if (w.st.end == UNWIND_COMPLETE && w.st.used_fp)
		w.st.end = UNWIND_COMPLETE_FP;
	*end = w.st.end;
	return w.st.n < MAX_USER_DEPTH ? w.st.n : MAX_USER_DEPTH;
}

#endif /* ARCH_TABLE_UNWIND */
#endif
