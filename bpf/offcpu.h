/* Off-CPU profiles: where threads wait, weighted by how long.
 *
 * One program on the sched_switch BTF tracepoint, which current kernels keep stable where
 * the functions around a context switch are inlined and renamed. It runs in the thread
 * going off the CPU (prev, the current task), so that thread's stacks are walked there,
 * with the same walkers as a CPU sample: nothing else can read its user memory. The thread
 * coming back (next) costs a lookup and a delete. How long the wait lasted is known only
 * then, so the switch-out sends its stacks at once (EVENT_OFFCPU, with the thread's trace
 * context ahead of it as for any sample), and the switch-in sends how long the wait was
 * (EVENT_OFFCPU_END) when it lasted at least offcpu_min_ns; user space pairs the two by
 * thread and start time and drops the stacks of shorter waits.
 *
 * A thread that was preempted is runnable, not waiting: only switch-outs in another state
 * count. Kernel threads, exiting threads and sonde itself are left out, and the --pid and
 * --cgroup filters apply. When switch-outs come faster than offcpu_walks_per_window per CPU
 * in a 100 ms window, a random sample of them is walked and each one's weight scaled by
 * the switch-outs it stands for, so totals stay right. sampler.bpf.c includes this after
 * fill_sample. */
#ifndef SONDE_OFFCPU_H
#define SONDE_OFFCPU_H

const volatile __u64 offcpu_min_ns = 1000000;
const volatile __u32 offcpu_walks_per_window = 100;
const volatile __u32 self_tgid = 0;

#define OFFCPU_WINDOW_NS 100000000ULL
#define PF_EXITING 0x00000004
#define PF_KTHREAD 0x00200000

/* Threads off the CPU whose stacks were sent, by thread id; sized by the loader. An LRU:
 * a host with more waiting threads than it holds forgets the longest waiting. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct offcpu_start);
} offcpu_starts SEC(".maps");

struct offcpu_rate {
	__u64 window_start;
	__u32 seen; /* switch-outs in this window */
	__u32 last; /* in the last one */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct offcpu_rate);
} offcpu_rates SEC(".maps");

/* offcpu_pick decides whether this switch-out is walked, and returns 0 if not, else 256
 * times the switch-outs it stands for. */
static __always_inline __u32 offcpu_pick(__u64 now)
{
	__u32 zero = 0;
	struct offcpu_rate *r = bpf_map_lookup_elem(&offcpu_rates, &zero);
	if (!r)
		return 0;
	if (now - r->window_start >= OFFCPU_WINDOW_NS) {
		/* A window with no switch-outs since leaves no rate to go by. */
		r->last = now - r->window_start < 2 * OFFCPU_WINDOW_NS ? r->seen : 0;
		r->seen = 0;
		r->window_start = now;
	}
	r->seen++;
	__u32 budget = offcpu_walks_per_window;
	__u32 rate = r->seen > r->last ? r->seen : r->last;
	if (budget == 0 || rate <= budget)
		return 256;
	if (bpf_get_prandom_u32() % rate >= budget)
		return 0;
	return (__u32)(((__u64)rate << 8) / budget);
}

/* offcpu_walk walks the current thread's stacks (its kernel stack if kernel) into a record
 * of kind and sends it, with its trace context ahead of it; it returns the record, or NULL
 * when none went. */
static __always_inline struct sample_event *offcpu_walk(void *ctx, __u64 id, __u32 kind, int kernel)
{
	__u32 zero = 0;
	struct sample_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return NULL;
	e->kind = kind;
	int known = 1;
	/* No mapping hints: bpf_find_vma's lock release is not to be queued from here. */
	__u64 size = fill_sample(ctx, e, id, &known, 0, kernel, 0);
	tracectx_emit(id >> 32, e->exec_id, e->cpu, e->ktime_ns);
	__u64 flags = BPF_RB_NO_WAKEUP;
	if (!known || bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > ring_wakeup_bytes)
		flags = BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_output(&events, e, size, flags)) {
		count(COUNTER_OFFCPU_LOST);
		return NULL;
	}
	return e;
}

/* offcpu_end sends the end of a wait that began at start (the walk's record's ktime_ns) as
 * a record of kind, weighted by the walk's scale, when it lasted at least the minimum. */
static __always_inline void offcpu_end(__u32 kind, __u32 pid, __u32 tid, __u64 start, __u64 scale, __u64 now, __u32 counter)
{
	if (now <= start)
		return;
	__u64 off = now - start;
	if (off < offcpu_min_ns) {
		count(COUNTER_OFFCPU_SHORT);
		return;
	}
	struct offcpu_end_event *ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
	if (!ev) {
		count(COUNTER_OFFCPU_LOST);
		return;
	}
	ev->kind = kind;
	ev->pid = pid;
	ev->tid = tid;
	ev->cpu = bpf_get_smp_processor_id();
	ev->start_ns = start;
	ev->end_ns = now;
	/* Scaled in two parts: a day off the CPU times a large scale overflows 64 bits. */
	ev->weight_ns = (off >> 8) * scale + (((off & 0xff) * scale) >> 8);
	bpf_ringbuf_submit(ev, 0);
	count(counter);
}

static __always_inline void offcpu_out(void *ctx, struct task_struct *prev, __u64 now)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (tgid == 0 || tgid == self_tgid || !prev->mm || (prev->flags & (PF_EXITING | PF_KTHREAD)) || !wanted(tgid))
		return;
	count(COUNTER_OFFCPU_SWITCHES);
	__u32 scale = offcpu_pick(now);
	if (!scale)
		return;
	/* The kernel stack starts with this program and the tracepoint's plumbing, which
	 * differs between kernels: user space cuts it at __schedule. */
	struct sample_event *e = offcpu_walk(ctx, id, EVENT_OFFCPU, 1);
	if (!e)
		return;
	count(COUNTER_OFFCPU_WALKED);
	struct offcpu_start st = {.start_ns = e->ktime_ns, .scale = scale, .pid = tgid};
	__u32 tid = (__u32)id;
	bpf_map_update_elem(&offcpu_starts, &tid, &st, BPF_ANY);
}

static __always_inline void offcpu_in(struct task_struct *next, __u64 now)
{
	__u32 tid = next->pid;
	struct offcpu_start *st = bpf_map_lookup_elem(&offcpu_starts, &tid);
	if (!st)
		return;
	struct offcpu_start v = *st;
	bpf_map_delete_elem(&offcpu_starts, &tid);
	offcpu_end(EVENT_OFFCPU_END, v.pid, tid, v.start_ns, v.scale, now, COUNTER_OFFCPU_SAMPLES);
}

/* offcpu_exit forgets an exiting thread's wait, should one be left: a thread waits no
 * more once it exits, whether or not its return to the CPU was seen. */
static __always_inline void offcpu_exit(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	if (bpf_map_lookup_elem(&offcpu_starts, &tid)) {
		bpf_map_delete_elem(&offcpu_starts, &tid);
		count(COUNTER_OFFCPU_STALE);
	}
}

/* sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
 * unsigned int prev_state), in prev. Attached only with --off-cpu. */
SEC("tp_btf/sched_switch")
int on_switch(__u64 *ctx)
{
	struct task_struct *prev = (struct task_struct *)ctx[1];
	struct task_struct *next = (struct task_struct *)ctx[2];
	__u64 now = bpf_ktime_get_ns();
	if (next)
		offcpu_in(next, now);
	/* TASK_RUNNING (0), or preempted: runnable, waiting for a CPU rather than for
	 * something. */
	if (prev && !(__u8)ctx[0] && (__u32)ctx[3] != 0)
		offcpu_out(ctx, prev, now);
	return 0;
}

/* Goroutines (with --off-cpu-goroutines). A goroutine that waits on a channel, a mutex, a
 * timer or the network parks in Go's scheduler, not in the kernel: its thread goes on to
 * run other goroutines, or sleeps in the scheduler, where a switch-out shows no goroutine.
 * A uprobe on runtime.gopark walks the goroutine's stack as it parks, much as a switch-out
 * does a thread's, and sends it at once (EVENT_GOPARK); one on runtime.execute, where the
 * scheduler runs a goroutine again, ends its wait (EVENT_GOPARK_END), paired in user space
 * by the thread it parked on and the time. User space attaches both to each Go binary it
 * makes a table for, at the PUSHQ BP of the functions' prologues, which the kernel emulates
 * (any other instruction it would single-step, a second trap); the rate of walks is the
 * switch-outs' (offcpu_pick). Go's register ABI only: the parking goroutine is the g
 * register, execute's goroutine its first argument. */

/* Parked goroutines whose stacks were sent; sized by the loader. An LRU: goroutines parked
 * for good (idle workers) give way to those that wait now. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, struct go_park_key);
	__type(value, struct go_park);
} go_parked SEC(".maps");

/* go_register reads the user register at offset off of the uprobe's struct pt_regs. */
static __always_inline __u64 go_register(struct pt_regs *ctx, __u64 off)
{
	__u64 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (void *)ctx + off);
	return v;
}

SEC("uprobe")
int on_gopark(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (tgid == 0 || tgid == self_tgid || !wanted(tgid))
		return 0;
	struct go_park_key k = {.g = go_register(ctx, __builtin_offsetof(struct arch_regs, ARCH_GO_G)), .pid = tgid};
	if (!k.g)
		return 0;
	count(COUNTER_GOPARKS);
	__u32 scale = offcpu_pick(bpf_ktime_get_ns());
	if (!scale)
		return 0;
	/* No kernel stack: it would be the uprobe's. */
	struct sample_event *e = offcpu_walk(ctx, id, EVENT_GOPARK, 0);
	if (!e)
		return 0;
	count(COUNTER_GOPARKS_WALKED);
	struct go_park v = {.start_ns = e->ktime_ns, .exec_id = e->exec_id, .scale = scale, .tid = (__u32)id};
	bpf_map_update_elem(&go_parked, &k, &v, BPF_ANY);
	return 0;
}

SEC("uprobe")
int on_execute(struct pt_regs *ctx)
{
	struct go_park_key k = {.g = go_register(ctx, __builtin_offsetof(struct arch_regs, ARCH_GO_ARG0)),
				.pid = bpf_get_current_pid_tgid() >> 32};
	struct go_park *p = bpf_map_lookup_elem(&go_parked, &k);
	if (!p)
		return 0;
	struct go_park v = *p;
	bpf_map_delete_elem(&go_parked, &k);
	struct task_struct *task = bpf_get_current_task_btf();
	if (task->self_exec_id != v.exec_id)
		return 0;
	offcpu_end(EVENT_GOPARK_END, k.pid, v.tid, v.start_ns, v.scale, bpf_ktime_get_ns(), COUNTER_GOPARK_SAMPLES);
	return 0;
}

#endif
