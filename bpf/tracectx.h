/* Trace context: what a sampled thread published about the work it is doing, read at the
 * sample so that the profile can say which span the CPU time went to.
 *
 * Two publishers are read. OpenTelemetry's thread context (OTEP 4947): a TLS pointer,
 * otel_thread_ctx_v1, to a record of trace-id, span-id, a valid byte, trace-flags and
 * attribute bytes. And Go's pprof labels, which the runtime keeps per goroutine behind
 * g.labels, and which a wrapper of the OpenTelemetry Go SDK sets to the span's IDs. User
 * space finds where both are per process (tracectx_procs); here they are only copied,
 * bounded, and checked as far as a copy can be, and sent as an EVENT_CONTEXT record just
 * before the sample, which user space parses.
 *
 * tracectx_emit is a global function: the verifier checks it once on its own, whatever the
 * sampling program around it does, and its cost does not multiply with the unwinder's
 * paths. sampler.bpf.c includes this after types.h, arch.h and its events ring. */
#ifndef SONDE_TRACECTX_H
#define SONDE_TRACECTX_H

/* Per process (tgid), what the kernel needs to read its trace context; sized by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tracectx_proc);
} tracectx_procs SEC(".maps");

/* The context record is built here, off the BPF stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tracectx_event);
} tracectx_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TRACECTX_COUNTER_MAX);
	__type(key, __u32);
	__type(value, __u64);
} tracectx_counters SEC(".maps");

const struct tracectx_proc *unused_tracectx_proc __attribute__((unused));
const struct tracectx_event *unused_tracectx_event __attribute__((unused));
const enum tracectx_counter *unused_tracectx_counter __attribute__((unused));
const enum ctx_source *unused_ctx_source __attribute__((unused));
const enum tls_model *unused_tls_model __attribute__((unused));
const enum go_labels_layout *unused_go_labels_layout __attribute__((unused));

static __always_inline void tracectx_count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&tracectx_counters, &which);
	if (c)
		(*c)++;
}

static __always_inline int read_u64(__u64 *dst, __u64 addr)
{
	return bpf_probe_read_user(dst, sizeof(*dst), (const void *)addr);
}

/* otel_slot returns the address of the thread's otel_thread_ctx_v1, or 0. */
static __always_inline __u64 otel_slot(struct tracectx_proc *p, __u64 tp)
{
	if (p->tls_model == TLS_STATIC)
		return tp + p->tls_offset;
	__u64 dtv = 0, block = 0, len = 0;
	if (read_u64(&dtv, tp + p->dtv_offset) || !dtv)
		return 0;
	__u32 shift = p->dtv_shift & 7;
	/* A thread whose DTV predates the module's dlopen has no slot for it yet. */
	if (p->dtv_len && (read_u64(&len, dtv + ((__s64)p->dtv_len << shift)) || len < p->tls_module))
		return 0;
	if (read_u64(&block, dtv + (p->tls_module << shift)))
		return 0;
	/* glibc allocates a module's dynamic TLS block on the thread's first access to it:
	 * until then the entry is 0 or TLS_DTV_UNALLOCATED (-1), and there is no context. */
	if (block == 0 || block == (__u64)-1)
		return 0;
	return block + p->tls_offset;
}

/* read_otel copies the thread's context record into ev and returns its length, or 0. */
static __always_inline __u32 read_otel(struct tracectx_event *ev, struct tracectx_proc *p, __u64 tp)
{
	__u64 slot = otel_slot(p, tp), rec = 0;
	if (!slot)
		return 0;
	if (read_u64(&rec, slot)) {
		tracectx_count(TRACECTX_READ_ERROR);
		return 0;
	}
	if (!rec)
		return 0; /* no span on this thread now */
	if (rec & 1) {
		tracectx_count(TRACECTX_INVALID); /* the OTEP aligns records to 2 bytes */
		return 0;
	}
	if (bpf_probe_read_user(ev->data, OTEL_RECORD_HEADER, (const void *)rec)) {
		tracectx_count(TRACECTX_READ_ERROR);
		return 0;
	}
	if (ev->data[24] != 1) {
		tracectx_count(TRACECTX_INVALID);
		return 0;
	}
	__u32 size = *(__u16 *)&ev->data[26];
	if (size > TRACECTX_DATA_MAX - OTEL_RECORD_HEADER) {
		tracectx_count(TRACECTX_OVERSIZED);
		return 0;
	}
	if (size) {
		if (bpf_probe_read_user(&ev->data[OTEL_RECORD_HEADER], size, (const void *)(rec + OTEL_RECORD_HEADER))) {
			tracectx_count(TRACECTX_READ_ERROR);
			return 0;
		}
		/* The thread is stopped, so its own writes cannot tear the record; another
		 * thread's, or the record being freed and reused, can. */
		__u32 again = 0;
		if (bpf_probe_read_user(&again, sizeof(again), (const void *)(rec + 24)) || again != *(__u32 *)&ev->data[24]) {
			tracectx_count(TRACECTX_TORN);
			return 0;
		}
	}
	tracectx_count(TRACECTX_OTEL);
	return OTEL_RECORD_HEADER + size;
}

/* A walk over a goroutine's labels, one bpf_loop step per label (slice) or map slot. */
struct labels_walk {
	struct tracectx_event *ev;
	__u64 base;   /* the []label's array, or the map's buckets */
	__u64 bucket; /* map: the bucket of the current slot */
	__u32 off;    /* bytes written to ev->data */
	__u32 count;  /* labels written */
	__u8 is_map;
	__u8 truncated;
	__u8 failed;
	__u8 tophash[8];
};

/* A map[string]string bucket before Go 1.24: 8 tophash bytes, 8 keys, 8 values, then the
 * overflow pointer. Slots whose tophash is below minTopHash (5) are empty or evacuated. */
#define GO_BUCKET_SIZE 272
#define GO_BUCKET_KEYS 8
#define GO_BUCKET_VALUES 136
#define GO_MIN_TOPHASH 5
/* Label maps stay tiny; at most 1 << GO_MAX_BUCKET_BITS buckets are read. */
#define GO_MAX_BUCKET_BITS 2

/* put_label appends one label; it returns 1 to end the walk. */
static __always_inline long put_label(struct labels_walk *w, __u64 key, __u64 klen, __u64 value, __u64 vlen)
{
	if (w->count >= GO_LABELS_MAX) {
		w->truncated = 1;
		return 1;
	}
	__u32 k = klen, v = vlen;
	if (klen > GO_LABEL_KEY_MAX) {
		k = GO_LABEL_KEY_MAX;
		w->truncated = 1;
	}
	if (vlen > GO_LABEL_VALUE_MAX) {
		v = GO_LABEL_VALUE_MAX;
		w->truncated = 1;
	}
	__u32 off = w->off;
	if (off + 2 + k + v > TRACECTX_DATA_MAX) {
		w->truncated = 1;
		return 1;
	}
	/* Restated for the verifier, which does not carry the sum's bound over to off. */
	if (off > TRACECTX_DATA_MAX)
		return 1;
	__u8 *out = &w->ev->data[off];
	out[0] = k;
	out[1] = v;
	if (bpf_probe_read_user(out + 2, k, (const void *)key) || bpf_probe_read_user(out + 2 + k, v, (const void *)value)) {
		w->failed = 1;
		return 1;
	}
	w->off = off + 2 + k + v;
	w->count++;
	return 0;
}

static long label_step(__u32 i, void *ctx)
{
	struct labels_walk *w = ctx;
	__u64 hdr[4]; /* key string, value string: pointer and length each */
	if (!w->is_map) {
		if (bpf_probe_read_user(hdr, sizeof(hdr), (const void *)(w->base + (__u64)i * sizeof(hdr)))) {
			w->failed = 1;
			return 1;
		}
		return put_label(w, hdr[0], hdr[1], hdr[2], hdr[3]);
	}
	__u32 slot = i & 7;
	if (slot == 0) {
		w->bucket = w->base + (__u64)(i >> 3) * GO_BUCKET_SIZE;
		if (bpf_probe_read_user(w->tophash, sizeof(w->tophash), (const void *)w->bucket)) {
			w->failed = 1;
			return 1;
		}
	}
	if (w->tophash[slot] < GO_MIN_TOPHASH)
		return 0;
	if (bpf_probe_read_user(hdr, 16, (const void *)(w->bucket + GO_BUCKET_KEYS + slot * 16)) ||
	    bpf_probe_read_user(&hdr[2], 16, (const void *)(w->bucket + GO_BUCKET_VALUES + slot * 16))) {
		w->failed = 1;
		return 1;
	}
	return put_label(w, hdr[0], hdr[1], hdr[2], hdr[3]);
}

/* read_go_labels copies the labels of the goroutine the thread runs (its m's curg, which
 * is the user goroutine also while the thread is on the scheduler's or a signal's stack)
 * into ev and returns their length, or 0. */
static __always_inline __u32 read_go_labels(struct tracectx_event *ev, struct tracectx_proc *p, __u64 tp)
{
	__u64 g = 0, m = 0, curg = 0, labels = 0;
	if (read_u64(&g, tp + p->go_g_offset) || !g)
		return 0; /* not a Go thread: a C thread of a cgo program, say */
	/* An m without a curg is in the scheduler, between goroutines: no labels then. */
	if (read_u64(&m, g + p->go_g_m) || (m && read_u64(&curg, m + p->go_m_curg)) ||
	    (curg && read_u64(&labels, curg + p->go_g_labels))) {
		tracectx_count(TRACECTX_READ_ERROR);
		return 0;
	}
	if (!labels)
		return 0;
	struct labels_walk w = {.ev = ev};
	__u32 steps;
	if (p->go_layout == GO_LABELS_SLICE) {
		__u64 slice[2]; /* array, length */
		if (bpf_probe_read_user(slice, sizeof(slice), (const void *)labels)) {
			tracectx_count(TRACECTX_READ_ERROR);
			return 0;
		}
		w.base = slice[0];
		steps = slice[1] > GO_LABELS_MAX ? GO_LABELS_MAX + 1 : slice[1];
	} else {
		__u64 hmap = 0, h[4]; /* count; flags, B, noverflow, hash0; buckets; oldbuckets */
		if (read_u64(&hmap, labels) || !hmap || bpf_probe_read_user(h, sizeof(h), (const void *)hmap)) {
			tracectx_count(TRACECTX_READ_ERROR);
			return 0;
		}
		if (h[0] == 0)
			return 0;
		if (h[3]) {
			tracectx_count(TRACECTX_TORN); /* growing: some labels are still in the old buckets */
			return 0;
		}
		__u32 bits = (h[1] >> 8) & 0xff;
		if (bits > GO_MAX_BUCKET_BITS) {
			bits = GO_MAX_BUCKET_BITS;
			w.truncated = 1;
		}
		w.is_map = 1;
		w.base = h[2];
		steps = 8 << bits;
	}
	bpf_loop(steps, label_step, &w, 0);
	if (w.truncated)
		tracectx_count(TRACECTX_GO_TRUNCATED);
	if (w.failed) {
		tracectx_count(TRACECTX_READ_ERROR);
		return 0;
	}
	if (!w.count)
		return 0;
	tracectx_count(TRACECTX_GO_LABELS);
	return w.off;
}

/* emit_context sends the trace context of the current thread of tgid, if it publishes
 * one, as the record of the sample taken on cpu at ktime_ns. It returns whether it did. */
static __always_inline int emit_context(__u32 tgid, __u64 exec_id, __u32 cpu, __u64 ktime_ns)
{
	struct tracectx_proc *p = bpf_map_lookup_elem(&tracectx_procs, &tgid);
	if (!p)
		return 0;
	if (p->exec_id && p->exec_id != exec_id) {
		tracectx_count(TRACECTX_STALE);
		return 0;
	}
	__u32 zero = 0;
	struct tracectx_event *ev = bpf_map_lookup_elem(&tracectx_scratch, &zero);
	if (!ev)
		return 0;
	__u64 tp = ARCH_THREAD_POINTER(bpf_get_current_task_btf());
	if (!tp)
		return 0;
	__u32 len = 0, source = CTX_NONE;
	if (p->tls_model != TLS_NONE && (len = read_otel(ev, p, tp)))
		source = CTX_OTEL;
	else if (p->go_layout != GO_LABELS_NONE && (len = read_go_labels(ev, p, tp)))
		source = CTX_GO_LABELS;
	if (!len || len > TRACECTX_DATA_MAX)
		return 0;
	ev->kind = EVENT_CONTEXT;
	ev->cpu = cpu;
	ev->ktime_ns = ktime_ns;
	ev->source = source;
	ev->len = len;
	if (bpf_ringbuf_output(&events, ev, __builtin_offsetof(struct tracectx_event, data) + len, BPF_RB_NO_WAKEUP)) {
		tracectx_count(TRACECTX_RINGBUF_FULL);
		return 0;
	}
	return 1;
}

/* Set by the loader with bpf.Config.CollectStats: time each look for a context, so that
 * what trace context reading adds to a sample is measured apart from the rest of it. */
const volatile __u8 tracectx_stats = 0;

/* tracectx_emit is emit_context, the sampling program's one call. */
__noinline int tracectx_emit(__u32 tgid, __u64 exec_id, __u32 cpu, __u64 ktime_ns)
{
	__u64 start = tracectx_stats ? bpf_ktime_get_ns() : 0;
	int sent = emit_context(tgid, exec_id, cpu, ktime_ns);
	if (tracectx_stats) {
		__u64 took = bpf_ktime_get_ns() - start;
		__u32 which = TRACECTX_NS;
		__u64 *c = bpf_map_lookup_elem(&tracectx_counters, &which);
		if (c)
			*c += took;
		tracectx_count(TRACECTX_CALLS);
	}
	return sent;
}

/* tracectx_forget drops a process's entry at exec and exit: the old image's offsets mean
 * nothing to the new one. */
static __always_inline void tracectx_forget(__u32 tgid)
{
	bpf_map_delete_elem(&tracectx_procs, &tgid);
}

#endif
