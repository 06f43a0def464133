/* walker runs bpf/unwinder.h natively, with stand-ins for the BPF helpers, so that tests
 * can hold the kernel's walker and package unwind's Go model of it to the same results.
 *
 * It reads cases from stdin, one after another, each a list of lines:
 *
 *   regs PC SP FP                 the interrupted registers
 *   ptregs R15 R14 ... SS         all 21 of them as the kernel's struct pt_regs holds them
 *   tls ADDR                      the thread pointer
 *   noproc                        walk without the process's mappings (frame pointers)
 *   map START END BIAS TABLE ROWS a mapping, in ascending order of START
 *   table ID N                    then N lines of struct unwind_row's fields, in order
 *   go ID TLS_G G_M ...           a table's struct go_runtime, its fields in order
 *   mem ADDR HEX                  readable memory: bytes from ADDR
 *   again                         the walk is a later sample of the previous case's process:
 *                                 the same writing of its mappings (gen)
 *   run                           walk, print "end E searches S frames F1 F2 ...", forget
 *                                 the case; S counts the tables searched (the memo's misses)
 *
 * Numbers are C literals (0x for hex). Reads of memory not given fail, as
 * bpf_probe_read_user does; a table id not given is a table missing from the kernel. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/types.h>

#include "types.h"
#include "arch.h"

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

#define MAX_TABLES 64
#define MAX_REGIONS 64

struct table {
	int present;
	__u32 n;
	struct unwind_row *rows;
	int has_go;
	struct go_runtime go;
};

struct region {
	__u64 addr;
	__u64 len;
	unsigned char *bytes;
};

static struct table tables[MAX_TABLES];
static struct region regions[MAX_REGIONS];
static int nregions;

static int walker_read_user(__u64 *dst, __u64 addr)
{
	for (int i = 0; i < nregions; i++) {
		struct region *r = &regions[i];
		if (addr >= r->addr && addr - r->addr <= r->len && r->len - (addr - r->addr) >= sizeof(*dst)) {
			memcpy(dst, r->bytes + (addr - r->addr), sizeof(*dst));
			return 0;
		}
	}
	*dst = 0; /* bpf_probe_read_user zeroes the destination on failure */
	return -EFAULT;
}

static int walker_read_pair(__u64 *dst, __u64 addr)
{
	if (walker_read_user(&dst[0], addr) || walker_read_user(&dst[1], addr + 8)) {
		dst[0] = dst[1] = 0;
		return -EFAULT;
	}
	return 0;
}

/* The only kernel memory the walker reads is the leaf's pt_regs, which the harness holds. */
static int walker_read_kernel(__u64 *dst, __u64 addr)
{
	memcpy(dst, (const void *)(uintptr_t)addr, sizeof(*dst));
	return 0;
}

static struct go_runtime *walker_go_runtime(__u32 id)
{
	if (id >= MAX_TABLES || !tables[id].has_go)
		return NULL;
	return &tables[id].go;
}

/* Tables looked up by the walk: one per frame the memo of rows did not have. */
static unsigned searches;

static void *walker_table(__u32 id)
{
	searches++;
	if (id >= MAX_TABLES || !tables[id].present)
		return NULL;
	return &tables[id];
}

static struct unwind_row *walker_row(void *table, __u32 i)
{
	struct table *t = table;
	if (i >= t->n)
		return NULL;
	return &t->rows[i];
}

/* bpf_loop: calls fn until it returns nonzero or n times, and returns the calls made. */
static long walker_loop(__u32 n, long (*fn)(__u32, void *), void *ctx)
{
	__u32 i;
	for (i = 0; i < n; i++)
		if (fn(i, ctx)) {
			i++;
			break;
		}
	return i;
}

#include "unwinder.h"

/* No runtime's JIT here: code without a table is walked by frame pointer, as the kernel
 * walks it in a process without one. */
static long walker_no_table(struct walk *w)
{
	return fp_step(&w->st);
}

static struct proc_info proc;
/* Kept across runs, as a CPU's is across samples; each run's mappings are a new writing
 * (gen), as SetProcess numbers them. Cases put other rows at the same addresses, so a
 * memo that outlived its writing shows as a disagreement with the model. */
static struct row_memo memo;
static __u32 gen;
static struct user_frames frames;
static struct arch_regs ptregs;

static void reset(void)
{
	for (int i = 0; i < MAX_TABLES; i++) {
		free(tables[i].rows);
		memset(&tables[i], 0, sizeof(tables[i]));
	}
	for (int i = 0; i < nregions; i++)
		free(regions[i].bytes);
	nregions = 0;
	memset(&proc, 0, sizeof(proc));
	memset(&ptregs, 0, sizeof(ptregs));
}

static void fail(const char *what, const char *line)
{
	fprintf(stderr, "walker: %s: %s\n", what, line);
	exit(2);
}

/* numbers reads n numbers (C literals, a minus sign allowed) into out; the full 64 bits,
 * where sscanf's %lli would saturate. */
static int numbers(const char *s, __u64 *out, int n)
{
	for (int i = 0; i < n; i++) {
		char *end;
		while (*s == ' ')
			s++;
		int neg = *s == '-';
		if (neg)
			s++;
		errno = 0;
		__u64 v = strtoull(s, &end, 0);
		if (end == s || errno)
			return 0;
		out[i] = neg ? -v : v;
		s = end;
	}
	return 1;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int main(void)
{
	size_t cap = 0;
	char *line = NULL;
	__u64 pc = 0, sp = 0, fp = 0, tls = 0;
	int noproc = 0, again = 0;
	while (getline(&line, &cap, stdin) > 0) {
		char *rest;
		if (!strncmp(line, "regs ", 5)) {
			__u64 v[3];
			if (!numbers(line + 5, v, 3))
				fail("bad regs", line);
			pc = v[0];
			sp = v[1];
			fp = v[2];
		} else if (!strncmp(line, "ptregs ", 7)) {
			if (!numbers(line + 7, (__u64 *)&ptregs, sizeof(ptregs) / sizeof(__u64)))
				fail("bad ptregs", line);
		} else if (!strncmp(line, "tls ", 4)) {
			if (!numbers(line + 4, &tls, 1))
				fail("bad tls", line);
		} else if (!strncmp(line, "go ", 3)) {
			__u64 v[12];
			if (!numbers(line + 3, v, 12) || v[0] >= MAX_TABLES)
				fail("bad go", line);
			struct table *t = &tables[v[0]];
			t->has_go = 1;
			t->go = (struct go_runtime){
				.tls_g = v[1],
				.g_m = v[2],
				.g_sched = v[3],
				.m_curg = v[4],
				.g_status = v[5],
				.gobuf_sp = v[6],
				.gobuf_pc = v[7],
				.gobuf_bp = v[8],
				.g_stack_hi = v[9],
				.cgo_depth = v[10],
				.cgo_g = v[11],
			};
		} else if (!strncmp(line, "noproc", 6)) {
			noproc = 1;
		} else if (!strncmp(line, "again", 5)) {
			again = 1;
		} else if (!strncmp(line, "map ", 4)) {
			__u64 v[5];
			if (!numbers(line + 4, v, 5))
				fail("bad map", line);
			if (proc.count >= MAX_PROC_MAPPINGS)
				fail("too many mappings", line);
			struct exec_mapping *m = &proc.maps[proc.count++];
			m->start = v[0];
			m->end = v[1];
			m->bias = v[2];
			m->table_id = v[3];
			m->rows_count = v[4];
		} else if (!strncmp(line, "table ", 6)) {
			__u64 v[2];
			if (!numbers(line + 6, v, 2) || v[0] >= MAX_TABLES || tables[v[0]].present || v[1] > 1 << 24)
				fail("bad table", line);
			__u64 id = v[0], n = v[1];
			struct table *t = &tables[id];
			t->present = 1;
			t->n = n;
			t->rows = calloc(n ? n : 1, sizeof(*t->rows));
			for (__u32 i = 0; i < n; i++) {
				__u64 v[8];
				if (getline(&line, &cap, stdin) <= 0 || !numbers(line, v, 8))
					fail("bad row", line ? line : "");
				t->rows[i] = (struct unwind_row){
					.pc = v[0],
					.cfa_offset = v[1],
					.fp_offset = v[2],
					.cfa_rule = v[3],
					.fp_rule = v[4],
					.cfa_reg = v[5],
					.cfa_index = v[6],
					.cfa_post = v[7],
				};
			}
		} else if (!strncmp(line, "mem ", 4)) {
			unsigned long long addr = strtoull(line + 4, &rest, 0);
			while (*rest == ' ')
				rest++;
			size_t hex = strcspn(rest, "\n");
			if (nregions >= MAX_REGIONS || hex % 2)
				fail("bad mem", line);
			struct region *r = &regions[nregions++];
			r->addr = addr;
			r->len = hex / 2;
			r->bytes = malloc(r->len ? r->len : 1);
			for (size_t i = 0; i < r->len; i++) {
				int hi = hexval(rest[2 * i]), lo = hexval(rest[2 * i + 1]);
				if (hi < 0 || lo < 0)
					fail("bad hex", line);
				r->bytes[i] = hi << 4 | lo;
			}
		} else if (!strncmp(line, "run", 3)) {
			__u32 end = UNWIND_END_MAX;
			memset(&frames, 0, sizeof(frames));
			proc.gen = again ? gen : ++gen;
			searches = 0;
			__u32 n = walk_user(&frames, noproc ? NULL : &proc, &memo, 0, 0, pc, sp, fp, (__u64)(uintptr_t)&ptregs, tls, &end);
			printf("end %u searches %u frames", end, searches);
			for (__u32 i = 0; i < n && i < MAX_USER_DEPTH; i++)
				printf(" %#llx", (unsigned long long)frames.pc[i]);
			printf("\n");
			reset();
			noproc = again = 0;
			pc = sp = fp = tls = 0;
		} else if (line[0] != '\n' && line[0] != '#') {
			fail("unknown line", line);
		}
	}
	fflush(stdout);
	return 0;
}
