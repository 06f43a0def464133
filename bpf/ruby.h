/* CRuby frames, interleaved with the native frames the walker found.
 *
 * A Ruby thread's frames are control frames on its execution context's VM stack: the
 * current one (ec->cfp) and each caller above it, up to the stack's end. CRuby runs a Ruby
 * call without a native call: one activation of vm_exec_core on the native stack runs the
 * control frames from the current one up to and including the first Ruby frame marked
 * VM_FRAME_FLAG_FINISH, where vm_exec was entered (the script, a block C code yields to, a
 * method C code calls). C methods (Array#each) have control frames too, pushed by the
 * activation that calls them and run by native code: their method entry names them, at
 * the caller's activation, under the native frames that run them. A Ruby method's frame is
 * named by its method entry too, which says its class. An activation is vm_exec's frame, which
 * calls vm_exec_core: vm_exec pushes the frame it runs before it calls the loop, and a
 * sample taken in between belongs to it. ruby_frames replaces each vm_exec frame by its
 * Ruby frames and leaves vm_exec_core's out, so a stack reads Ruby, C method, Ruby, in the
 * order they called each other.
 *
 * The sampled thread's execution context is ruby_current_ec, a TLS variable of libruby:
 * user space says where it lies from the thread pointer (static TLS), or which module's
 * block holds it (dynamic TLS), as tracectx.h reads OpenTelemetry's thread context.
 *
 * Everything it reads is the process's, which can lie: reads are checked, loops bounded by
 * RUBY_MAX_FRAMES, and offsets masked into the scratch buffer. sampler.bpf.c includes it
 * after unwinder.h with the same helpers. */
#ifndef SONDE_RUBY_H
#define SONDE_RUBY_H

/* Ruby's number among the runtimes (types.h, enum interp_frame_encoding), and how its 58
 * bits of a frame hold what names it and a position: a kind bit; an object's address >>
 * RUBY_ISEQ_ALIGN_SHIFT (objects are 8-byte aligned, user addresses below 2^47: 44 bits),
 * the instruction sequence's, or for a method (RUBY_KIND_METHOD) its method entry's, which
 * also says its class, or names a C method; then the position of the frame's pc in its
 * instructions, in words, saturated at RUBY_POS_MASK. */
enum ruby_frame_encoding {
	RUBY_RUNTIME = 6,
	RUBY_ISEQ_ALIGN_SHIFT = 3,
	RUBY_POS_BITS = 13,
	RUBY_POS_MASK = (1 << 13) - 1,
	RUBY_KIND_METHOD_BIT = 57,
};

/* How the walk of a Ruby thread's frames ended. */
enum ruby_end {
	RUBY_COMPLETE = 0,  /* every vm_exec_core activation got its frames */
	RUBY_NO_EC = 1,     /* the thread has no execution context: not a Ruby thread */
	RUBY_BAD_READ = 2,  /* reading the VM's memory failed */
	RUBY_TRUNCATED = 3, /* MAX_USER_DEPTH frames and Ruby frames left */
	RUBY_INVALID = 4,   /* a frame the walk cannot follow: outside the VM stack, misaligned */
	RUBY_END_MAX,
};

enum ruby_limits {
	RUBY_MAX_CFP_READ = 64,         /* bytes of a control frame read: its size at most */
	RUBY_MAX_FRAMES = 192,          /* control frames walked per sample */
	RUBY_FRAME_FINISH = 0x20,       /* VM_FRAME_FLAG_FINISH */
	RUBY_FRAME_CFRAME = 0x80,       /* VM_FRAME_FLAG_CFRAME: a C method's frame */
	RUBY_ENV_LOCAL = 0x2,           /* VM_ENV_FLAG_LOCAL: ep[-2] holds the method entry (or a cref, an svar) */
};

/* The frame's type (VM_FRAME_MAGIC_*), in its flags under VM_FRAME_MAGIC_MASK. */
enum ruby_magic {
	RUBY_MAGIC_MASK = 0x7fff0001,
	RUBY_MAGIC_METHOD = 0x11110001,
	RUBY_MAGIC_CFUNC = 0x55550001,
};

/* Where a Ruby process keeps its threads' frames, and how to read them: offsets from
 * sonde's table of CRuby's layouts by version. Addresses are the process's. */
struct ruby_proc {
	__u64 exec_id;              /* the exec the addresses belong to; 0: unknown */
	__u64 exec_start, exec_end; /* vm_exec (rb_vm_exec before 3.3), an activation */
	__u64 vm_start, vm_end;     /* vm_exec_core, the loop it calls */
	__u64 cold_start, cold_end; /* the loop's part the compiler moved out of line, or 0, 0 */
	__u64 jit_start, jit_end;   /* YJIT's code, or 0, 0 */
	__s64 tls_offset;           /* ruby_current_ec: from the thread pointer, or in its module's block */
	__u64 tls_module;           /* the module whose block holds it (dynamic TLS); 0: static */
	__s32 dtv_offset;           /* dynamic TLS: the DTV pointer's place from the thread pointer */
	__s32 dtv_len;              /* the entry holding the DTV's length; 0: not checked */
	__u16 dtv_shift;            /* a DTV entry is 1 << dtv_shift bytes */
	__u16 ec_vm_stack;          /* rb_execution_context_t: vm_stack */
	__u16 ec_vm_stack_size;     /* vm_stack_size, in VALUEs */
	__u16 ec_cfp;               /* cfp */
	__u16 cfp_size;             /* sizeof(rb_control_frame_t) */
	__u16 cfp_pc;               /* rb_control_frame_t: pc */
	__u16 cfp_iseq;             /* iseq */
	__u16 cfp_ep;               /* ep; ep[0] holds the frame's flags */
	__u16 iseq_body;            /* rb_iseq_t: body */
	__u16 body_encoded;         /* rb_iseq_constant_body: iseq_encoded */
	__u16 pad[2];
};

/* For bpf2go -type. */
const struct ruby_proc *unused_ruby_proc __attribute__((unused));
const enum ruby_end *unused_ruby_end __attribute__((unused));
const enum ruby_frame_encoding *unused_ruby_frame_encoding __attribute__((unused));
const enum ruby_limits *unused_ruby_limits __attribute__((unused));
const enum ruby_magic *unused_ruby_magic __attribute__((unused));

/* Per-process VM state, written by user space (package interp/ruby) when it finds CRuby
 * mapped, deleted at exec and exit like proc_maps. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct ruby_proc);
} ruby_procs SEC(".maps");

struct ruby_scratch {
	struct state_walk st; /* in the per-CPU scratch map, not on the BPF stack (see python.h) */
	__u64 end_cfp;        /* the VM stack's end, past the outermost control frame */
	__u32 in_loop;        /* the activation being opened runs its loop (a vm_exec_core frame above it) */
	__u32 stepped_in;     /* st->in when the open activation was first stepped */
	__u64 native[MAX_USER_DEPTH];
	__u8 cfp[2 * RUBY_MAX_CFP_READ]; /* a control frame's bytes; offsets are masked below RUBY_MAX_CFP_READ */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ruby_scratch);
} ruby_scratch_map SEC(".maps");

/* How the walks ended, per CPU, one per enum ruby_end. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RUBY_END_MAX);
	__type(key, __u32);
	__type(value, __u64);
} ruby_counters SEC(".maps");

static __always_inline void ruby_count(__u32 end)
{
	if (end >= RUBY_END_MAX)
		end = RUBY_INVALID;
	__u64 *c = bpf_map_lookup_elem(&ruby_counters, &end);
	if (c)
		(*c)++;
}

/* ruby_forget drops a process's VM at its exec or exit. */
static __always_inline void ruby_forget(__u32 tgid)
{
	bpf_map_delete_elem(&ruby_procs, &tgid);
}

#if ARCH_TABLE_UNWIND

struct ruby_walk {
	struct ruby_proc *proc;
	struct ruby_scratch *s;
	__u64 *out; /* the sample's user frames */
};

/* Return addresses point after the call: one byte back is inside the function. */
static __always_inline int ruby_in_exec(struct ruby_proc *p, __u64 pc)
{
	return pc > p->exec_start && pc <= p->exec_end;
}

/* The VM's loop, or YJIT's code, which runs the activation's frames as the loop would:
 * the native walk crosses YJIT's frames by their frame pointers. */
static __always_inline int ruby_in_loop(struct ruby_proc *p, __u64 pc)
{
	return (pc > p->vm_start && pc <= p->vm_end) || (pc > p->cold_start && pc <= p->cold_end) ||
	       (pc > p->jit_start && pc <= p->jit_end);
}

static __always_inline __u64 ruby_field(struct ruby_scratch *s, __u16 off)
{
	if (off > RUBY_MAX_CFP_READ - 8)
		return 0;
	return *(__u64 *)&s->cfp[off & (RUBY_MAX_CFP_READ - 1)];
}

static __always_inline void ruby_emit(struct ruby_walk *w, __u64 v) { state_emit(&w->s->st, w->out, v); }

static __always_inline void ruby_close(struct ruby_walk *w) { state_close(&w->s->st, w->out); }

/* ruby_method_entry returns what ep[-2] of a method's frame holds: its method entry, or the
 * svar holding it that took its place when the method used $~ or $_, which user space
 * follows; 0 where it is no user address. Reading its type here would cost a read per
 * frame that user space does once per method. */
static __always_inline __u64 ruby_method_entry(__u64 v)
{
	return !v || v & 7 || v >> 47 ? 0 : v;
}

/* ruby_step reads one control frame of the open activation and emits it if it is Ruby's. */
static __always_inline long ruby_step(struct ruby_walk *w)
{
	struct ruby_proc *p = w->proc;
	struct ruby_scratch *s = w->s;
	struct state_walk *st = &s->st;
	if (!st->frame || st->frame >= s->end_cfp) {
		st->frame = 0;
		ruby_close(w);
		st->tail = 0;
		return 0;
	}
	if (++st->walked > RUBY_MAX_FRAMES) {
		st->end = RUBY_TRUNCATED;
		return 1;
	}
	__u32 size = p->cfp_size;
	if (size > RUBY_MAX_CFP_READ || size < 8) {
		st->end = RUBY_INVALID;
		return 1;
	}
	if (bpf_probe_read_user(s->cfp, size, (void *)st->frame)) {
		st->end = RUBY_BAD_READ;
		return 1;
	}
	__u64 pc = ruby_field(s, p->cfp_pc), iseq = ruby_field(s, p->cfp_iseq), ep = ruby_field(s, p->cfp_ep);
	__u64 env[3] = {}; /* ep[-2] (the method entry, a cref or an svar), ep[-1], ep[0] (the flags) */
	if (!ep || bpf_probe_read_user(env, sizeof(env), (void *)(ep - 16))) {
		st->end = RUBY_BAD_READ;
		return 1;
	}
	__u64 flags = env[2];
	__u8 first = s->stepped_in != st->in, outside = first && !s->in_loop;
	if (first) {
		s->stepped_in = st->in;
		s->in_loop = 0;
	}
	/* vm_exec caught outside its loop, the frame it runs not (or no longer) current: the
	 * frame it was entered for is pushed before it is called and popped before it returns,
	 * FINISH marking it. What is current belongs to the activations below. */
	if (outside && !st->tail && !(flags & RUBY_FRAME_FINISH)) {
		ruby_close(w);
		return 0;
	}
	st->frame += size;
	__u64 magic = flags & RUBY_MAGIC_MASK;
	/* A C method's frame: its method entry names it (Array#each), above the native frames
	 * that run it. A dummy frame, or another without code: nothing. */
	if (magic == RUBY_MAGIC_CFUNC || flags & RUBY_FRAME_CFRAME) {
		__u64 me = magic == RUBY_MAGIC_CFUNC ? ruby_method_entry(env[0]) : 0;
		if (me) {
			ruby_emit(w, INTERP_FRAME(RUBY_RUNTIME, 1ULL << RUBY_KIND_METHOD_BIT | (me >> RUBY_ISEQ_ALIGN_SHIFT) << RUBY_POS_BITS));
			st->emitted = 1;
		}
		return 0;
	}
	if (!pc || !iseq)
		return 0;
	if (iseq & ((1 << RUBY_ISEQ_ALIGN_SHIFT) - 1) || iseq >> 47) {
		st->end = RUBY_INVALID;
		return 1;
	}
	__u64 body = 0, encoded = 0, pos = 0;
	if (bpf_probe_read_user(&body, sizeof(body), (void *)(iseq + p->iseq_body)) ||
	    bpf_probe_read_user(&encoded, sizeof(encoded), (void *)(body + p->body_encoded))) {
		st->end = RUBY_BAD_READ;
		return 1;
	}
	if (pc > encoded)
		pos = (pc - encoded) / 8;
	if (pos > RUBY_POS_MASK)
		pos = RUBY_POS_MASK;
	/* A method's frame is named by its method entry, which holds its class as well as its
	 * sequence; a block's, a class body's, the script's by the sequence. */
	__u64 code = iseq, kind = 0;
	if (magic == RUBY_MAGIC_METHOD && flags & RUBY_ENV_LOCAL) {
		__u64 me = ruby_method_entry(env[0]);
		if (me)
			code = me, kind = 1ULL << RUBY_KIND_METHOD_BIT;
	}
	ruby_emit(w, INTERP_FRAME(RUBY_RUNTIME, kind | (code >> RUBY_ISEQ_ALIGN_SHIFT) << RUBY_POS_BITS | pos));
	st->emitted = 1;
	/* Where vm_exec was entered: frames above belong to the activation of vm_exec_core
	 * that called out of it through native code. */
	if (flags & RUBY_FRAME_FINISH && !st->tail)
		ruby_close(w);
	return 0;
}

/* ruby_drop leaves vm_exec_core's frames and YJIT's out, and notes that the vm_exec under
 * them runs its loop. */
static __always_inline int ruby_drop(struct ruby_walk *w, __u64 pc)
{
	if (!ruby_in_loop(w->proc, pc))
		return 0;
	w->s->in_loop = 1;
	return 1;
}

STATE_MERGE_STEP(ruby, ruby_walk, ruby_in_exec, ruby_drop, ruby_step, RUBY_TRUNCATED)

/* ruby_ec_slot returns where the thread's ruby_current_ec is, or 0. */
static __always_inline __u64 ruby_ec_slot(struct ruby_proc *p, __u64 tp)
{
	if (!p->tls_module)
		return tp + p->tls_offset;
	__u64 dtv = 0, block = 0, len = 0;
	if (bpf_probe_read_user(&dtv, sizeof(dtv), (void *)(tp + p->dtv_offset)) || !dtv)
		return 0;
	__u32 shift = p->dtv_shift & 7;
	if (p->dtv_len && (bpf_probe_read_user(&len, sizeof(len), (void *)(dtv + ((__s64)p->dtv_len << shift))) ||
			   len < p->tls_module))
		return 0;
	if (bpf_probe_read_user(&block, sizeof(block), (void *)(dtv + (p->tls_module << shift))))
		return 0;
	if (block == 0 || block == (__u64)-1)
		return 0;
	return block + p->tls_offset;
}

/* ruby_frames rewrites the sample's n user frames with the Ruby frames of each
 * vm_exec_core activation among them and returns how many there are now. complete 0: the
 * native walk stopped short of the outermost frame, and Ruby frames its activations left
 * over go at the root end. */
__noinline int ruby_frames(struct sample_event *e, __u32 n, __u32 complete)
{
	if (!e)
		return 0;
	if (n > MAX_USER_DEPTH)
		n = MAX_USER_DEPTH;
	__u32 pid = e->pid;
	struct ruby_proc *p = bpf_map_lookup_elem(&ruby_procs, &pid);
	/* exec_id 0: user space read the process before it knew its exec. */
	if (!p || (p->exec_id && p->exec_id != e->exec_id) || !p->exec_start)
		return n;
	__u32 zero = 0;
	struct ruby_scratch *s = bpf_map_lookup_elem(&ruby_scratch_map, &zero);
	if (!s)
		return n;
	if (bpf_probe_read_kernel(s->native, n * sizeof(__u64), e->frames))
		return n;
	struct state_walk *st = &s->st;
	__builtin_memset(st, 0, sizeof(*st));
	st->n_in = n;
	st->tail = !complete;
	s->in_loop = 0;
	s->stepped_in = 0;
	__u64 slot = ruby_ec_slot(p, ARCH_THREAD_POINTER(bpf_get_current_task_btf()));
	__u64 ec = 0, head[4] = {};
	if (!slot || bpf_probe_read_user(&ec, sizeof(ec), (void *)slot) || !ec) {
		ruby_count(RUBY_NO_EC);
		return n;
	}
	/* The three fields are the context's first words (checked at load: at most 16). */
	if (p->ec_cfp > 16 || p->ec_vm_stack > 16 || p->ec_vm_stack_size > 16 ||
	    bpf_probe_read_user(head, 3 * sizeof(__u64), (void *)ec)) {
		ruby_count(RUBY_BAD_READ);
		return n;
	}
	__u64 stack = head[(p->ec_vm_stack / 8) & 3], size = head[(p->ec_vm_stack_size / 8) & 3];
	st->frame = head[(p->ec_cfp / 8) & 3];
	s->end_cfp = stack + size * 8;
	if (st->frame < stack || st->frame >= s->end_cfp || size > (1 << 24)) {
		ruby_count(RUBY_INVALID);
		return n;
	}
	struct ruby_walk w = {.proc = p, .s = s, .out = e->frames};
	bpf_loop(MAX_USER_DEPTH + RUBY_MAX_FRAMES + 1, ruby_merge_step, &w, 0);
	__u32 out = st->n_out;
	if (out > MAX_USER_DEPTH)
		out = MAX_USER_DEPTH;
	ruby_count(st->end);
	return out;
}

/* YJIT's code, walked within the native walk as a JIT runtime's (runtimes.h lists Ruby
 * there as ruby_jit, whose state is Ruby's). */
#define ruby_jit_proc ruby_proc
#define ruby_jit_procs ruby_procs

static __always_inline int ruby_jit_in_code(struct ruby_proc *p, __u64 pc)
{
	return pc >= p->jit_start && pc < p->jit_end;
}

/* The native frame YJIT's entry prologue makes, called from vm_exec or its loop: it pushes
 * r13, r12 and rbx (the VM's registers) under the return address, and rbp before them
 * where it keeps frame pointers (--yjit-perf); its code then leaves sp be, between calls
 * to C as during them. */
enum ruby_jit_frame {
	RUBY_JIT_RA = 24,    /* the return address, from sp */
	RUBY_JIT_FP_RA = 32, /* with rbp pushed: the return address; rbp is at RUBY_JIT_RA */
};

static __always_inline int ruby_vm_code(struct ruby_proc *p, __u64 ra)
{
	return ruby_in_exec(p, ra) || (ra > p->vm_start && ra <= p->vm_end) || (ra > p->cold_start && ra <= p->cold_end);
}

/* ruby_jit_frames records the frame of YJIT's code at st->pc and moves to the VM code that
 * entered it: the return address is where the prologue left it, with or without rbp, and
 * must point into the VM. Elsewhere (a stub that saved registers of its own) the frame is
 * walked by frame pointer, as code without a table is. */
__noinline long ruby_jit_frames(struct unwind_state *st, struct user_frames *frames, struct ruby_proc *p, __u32 pid, __u64 exec_id)
{
	/* Every argument is used: clang passes no value for one a global function ignores,
	 * which the verifier refuses at the call. pid 0 is the idle task's. */
	if (!st || !frames || !p || pid == 0 || (p->exec_id && p->exec_id != exec_id))
		return 1;
	if (st->n >= MAX_USER_DEPTH)
		return finish(st, UNWIND_TRUNCATED);
	frames->pc[st->n & (MAX_USER_DEPTH - 1)] = st->pc;
	st->n++;
	__u64 ra = 0, fp = 0;
	if (walker_read_user(&ra, st->sp + RUBY_JIT_RA))
		return finish(st, UNWIND_BAD_READ);
	if (ruby_vm_code(p, ra))
		return advance(st, st->sp + RUBY_JIT_RA + 8, ra, st->fp, 1);
	fp = ra;
	if (walker_read_user(&ra, st->sp + RUBY_JIT_FP_RA))
		return finish(st, UNWIND_BAD_READ);
	if (ruby_vm_code(p, ra))
		return advance(st, st->sp + RUBY_JIT_FP_RA + 8, ra, fp, 1);
	return fp_step(st);
}

#endif /* ARCH_TABLE_UNWIND */
#endif
