package testprog

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// threadCtxLib defines otel_thread_ctx_v1 and attaches records as OTEP 4947 describes: the
// TLS pointer set to NULL, then to the new record, with compiler fences between.
const threadCtxLib = `#include <stdatomic.h>
#include <stddef.h>
__attribute__((visibility("default"))) __thread void *otel_thread_ctx_v1;
__attribute__((visibility("default"), noinline)) void ctx_attach(void *record) {
	otel_thread_ctx_v1 = NULL;
	atomic_signal_fence(memory_order_seq_cst);
	otel_thread_ctx_v1 = record;
	atomic_signal_fence(memory_order_seq_cst);
}
`

// threadCtxMain publishes a process context (OTEP 4719) naming the service argv[2], with
// threadlocal.schema_version argv[3] and a key map of http.route and user, then runs two
// threads for argv[1] seconds that go from span to span, 40 ms each, spinning, and logs
// each span on stdout as "span TID START_NS END_NS TRACE_ID SPAN_ID ROUTE USER", with
// CLOCK_REALTIME times. With argv[3] "none" it publishes nothing and attaches no record:
// the same work, without a context.
const threadCtxMain = `#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

void ctx_attach(void *record);

struct record {
	uint8_t trace_id[16];
	uint8_t span_id[8];
	uint8_t valid;
	uint8_t flags;
	uint16_t attrs_size;
	uint8_t attrs[100];
} __attribute__((aligned(8)));

static double seconds;
static int publish = 1;
static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;
static volatile uint64_t sink;

static uint64_t now_ns(clockid_t c) { struct timespec t; clock_gettime(c, &t); return (uint64_t)t.tv_sec * 1000000000u + t.tv_nsec; }

/* Protobuf, as much as the process context needs. */
static size_t varint(uint8_t *b, uint64_t v) { size_t n = 0; do { b[n] = (v & 0x7f) | (v > 0x7f ? 0x80 : 0); v >>= 7; n++; } while (v); return n; }
static size_t field(uint8_t *b, int num, const void *data, size_t len) {
	size_t n = varint(b, (uint64_t)num << 3 | 2);
	n += varint(b + n, len);
	memcpy(b + n, data, len);
	return n + len;
}
static size_t str_value(uint8_t *b, const char *s) { return field(b, 1, s, strlen(s)); }
static size_t key_value(uint8_t *b, const char *k, const uint8_t *v, size_t vlen) {
	size_t n = field(b, 1, k, strlen(k));
	return n + field(b + n, 2, v, vlen);
}

static void publish_context(const char *service, const char *schema) {
	uint8_t tmp[256], tmp2[256], kv[512], payload[1024];
	size_t n = 0, m;
	/* resource { attributes { service.name } } */
	m = str_value(tmp, service);
	m = key_value(kv, "service.name", tmp, m);
	size_t res = field(tmp2, 1, kv, m);
	n += field(payload + n, 1, tmp2, res);
	/* attributes: schema version, key map */
	m = str_value(tmp, schema);
	m = key_value(kv, "threadlocal.schema_version", tmp, m);
	n += field(payload + n, 2, kv, m);
	size_t a = 0;
	uint8_t v1[64], v2[64];
	size_t l1 = str_value(v1, "http.route"), l2 = str_value(v2, "user");
	a += field(tmp + a, 1, v1, l1);
	a += field(tmp + a, 1, v2, l2);
	m = field(tmp2, 5, tmp, a); /* AnyValue.array_value */
	m = key_value(kv, "threadlocal.attribute_key_map", tmp2, m);
	n += field(payload + n, 2, kv, m);

	long page = sysconf(_SC_PAGESIZE);
	int fd = syscall(SYS_memfd_create, "OTEL_CTX", 1u /* MFD_CLOEXEC */);
	uint8_t *h;
	if (fd >= 0) {
		if (ftruncate(fd, page)) abort();
		h = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
		close(fd);
	} else {
		h = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	}
	if (h == MAP_FAILED) abort();
	madvise(h, page, MADV_DONTFORK);
	memcpy(h + 32, payload, n);
	memcpy(h, "OTEL_CTX", 8);
	uint32_t version = 2, size = n;
	uint64_t ptr = (uint64_t)(uintptr_t)(h + 32);
	memcpy(h + 8, &version, 4);
	memcpy(h + 12, &size, 4);
	memcpy(h + 24, &ptr, 8);
	atomic_thread_fence(memory_order_seq_cst);
	uint64_t at = now_ns(CLOCK_BOOTTIME);
	memcpy(h + 16, &at, 8);
	prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, h, page, "OTEL_CTX");
}

static size_t put_attr(uint8_t *b, int key, const char *v) { size_t l = strlen(v); b[0] = key; b[1] = l; memcpy(b + 2, v, l); return l + 2; }

static void *worker(void *arg) {
	int id = (int)(intptr_t)arg;
	pid_t tid = syscall(SYS_gettid);
	struct record recs[2];
	char lines[64][160];
	int nlines = 0;
	double end = now_ns(CLOCK_MONOTONIC) / 1e9 + seconds;
	for (uint32_t n = 1; now_ns(CLOCK_MONOTONIC) / 1e9 < end; n++) {
		struct record *r = &recs[n & 1];
		char route[32], user[16];
		snprintf(route, sizeof route, "/route/%u", n);
		snprintf(user, sizeof user, "u%d", id);
		memset(r, 0, sizeof *r);
		uint32_t pid = getpid();
		memcpy(r->trace_id, &pid, 4);
		r->trace_id[4] = id;
		memcpy(r->trace_id + 8, &n, 4);
		r->span_id[0] = id + 1;
		memcpy(r->span_id + 4, &n, 4);
		r->flags = 1;
		size_t a = put_attr(r->attrs, 0, route);
		a += put_attr(r->attrs + a, 1, user);
		r->attrs_size = a;
		r->valid = 1;
		uint64_t start = now_ns(CLOCK_REALTIME);
		if (publish) ctx_attach(r);
		uint64_t until = now_ns(CLOCK_MONOTONIC) + 40000000u;
		while (now_ns(CLOCK_MONOTONIC) < until)
			for (int i = 0; i < 1000; i++) sink = sink * 31 + i;
		uint64_t stop = now_ns(CLOCK_REALTIME);
		char *l = lines[nlines++];
		int k = snprintf(l, 160, "span %d %llu %llu ", tid, (unsigned long long)start, (unsigned long long)stop);
		for (int i = 0; i < 16; i++) k += snprintf(l + k, 160 - k, "%02x", r->trace_id[i]);
		l[k++] = ' ';
		for (int i = 0; i < 8; i++) k += snprintf(l + k, 160 - k, "%02x", r->span_id[i]);
		snprintf(l + k, 160 - k, " %s %s", route, user);
		if (nlines == 64) {
			pthread_mutex_lock(&out);
			for (int i = 0; i < nlines; i++) puts(lines[i]);
			fflush(stdout);
			pthread_mutex_unlock(&out);
			nlines = 0;
		}
	}
	if (publish) ctx_attach(NULL);
	pthread_mutex_lock(&out);
	for (int i = 0; i < nlines; i++) puts(lines[i]);
	fflush(stdout);
	pthread_mutex_unlock(&out);
	return NULL;
}

int main(int argc, char **argv) {
	if (argc < 4) return 2;
	seconds = atof(argv[1]);
	publish = strcmp(argv[3], "none") != 0;
	if (publish) publish_context(argv[2], argv[3]);
	/* Started by a test that waits for this line before it starts sampling. */
	printf("ready\n");
	fflush(stdout);
	pthread_t t[2];
	for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
	for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
	return 0;
}
`

// ThreadContextVariants are the ways BuildThreadContext can build the thread context
// program: the variable in the executable (static TLS, local-exec), and in a shared
// library the executable links, with the TLSDESC dialect (gnu2) or the legacy
// global-dynamic one (gnu).
var ThreadContextVariants = []string{"exe", "tlsdesc", "gd"}

// BuildThreadContext builds the thread context program as variant says and returns its
// path; it runs as PROG SECONDS SERVICE SCHEMA (see threadCtxMain).
func BuildThreadContext(t testing.TB, variant string) string {
	t.Helper()
	gcc := testenv.RequireTool(t, "gcc")
	dir := t.TempDir()
	write := func(name, src string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := func(args ...string) {
		if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %v: %v\n%s", args, err, out)
		}
	}
	main, lib := write("threadctx.c", threadCtxMain), write("ctxlib.c", threadCtxLib)
	bin := filepath.Join(dir, "threadctx-"+variant)
	switch variant {
	case "exe":
		// The OTEP asks for the symbol in .dynsym even in an executable.
		run("-O1", "-pthread", "-o", bin, main, lib, "-Wl,--export-dynamic-symbol=otel_thread_ctx_v1")
	case "tlsdesc", "gd":
		dialect := map[string]string{"tlsdesc": "gnu2", "gd": "gnu"}[variant]
		so := filepath.Join(dir, "libotelctx.so")
		run("-O1", "-fPIC", "-shared", "-mtls-dialect="+dialect, "-o", so, lib)
		run("-O1", "-pthread", "-o", bin, main, "-L"+dir, "-lotelctx", "-Wl,-rpath,"+dir)
	default:
		t.Fatalf("thread context variant %q", variant)
	}
	return bin
}
