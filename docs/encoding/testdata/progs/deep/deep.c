/* deep is the "deep" corpus's workload: an interpreter-like recursion 90-120 calls deep
 * through three mutually recursive functions, the path chosen by one of eight "programs",
 * ending in one of four leaf workloads (one of them a syscall, for kernel frames). Stacks
 * thus share long root prefixes and differ in the middle and at the leaf, as an
 * interpreter's do. It runs for argv[1] seconds and exits by itself.
 *
 *   cc -O1 -g -fno-inline -fno-optimize-sibling-calls -o deep deep.c -lm
 */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t sink;
static int devnull;
static char bufa[4096], bufb[4096];

static const unsigned programs[8] = {
	0x9e3779b9u, 0x7f4a7c15u, 0x94d049bbu, 0xbf58476du,
	0x2545f491u, 0x6c8e9cf5u, 0x00000000u, 0xffffffffu,
};

static uint64_t leaf_hash(int n) {
	uint64_t h = 1469598103934665603ull;
	for (int i = 0; i < n * 64; i++)
		h = (h ^ (uint64_t)i) * 1099511628211ull;
	return h;
}

static uint64_t leaf_copy(int n) {
	for (int i = 0; i < n; i++)
		memcpy(bufa, bufb, sizeof bufa);
	return (uint64_t)bufa[n & 4095];
}

static uint64_t leaf_math(int n) {
	double x = 0;
	for (int i = 1; i < n * 16; i++)
		x += sqrt((double)i) * sin((double)i);
	return (uint64_t)x;
}

static uint64_t leaf_syscall(int n) {
	for (int i = 0; i < n / 8 + 1; i++)
		if (write(devnull, bufa, sizeof bufa) < 0)
			return 0;
	return 1;
}

static uint64_t leaf(int kind, int n) {
	switch (kind & 3) {
	case 0: return leaf_hash(n);
	case 1: return leaf_copy(n);
	case 2: return leaf_math(n);
	default: return leaf_syscall(n);
	}
}

static uint64_t eval(int depth, unsigned prog, int kind);
static uint64_t apply(int depth, unsigned prog, int kind);
static uint64_t reduce(int depth, unsigned prog, int kind);

/* next picks the callee at this depth from the program's bits: the same program always
 * takes the same path, so its stacks repeat. */
static uint64_t next(int depth, unsigned prog, int kind) {
	if (depth == 0)
		return leaf(kind, 40);
	switch ((prog >> (depth % 30)) & 3) {
	case 0: return eval(depth - 1, prog, kind) + 1;
	case 1: return apply(depth - 1, prog, kind) + 2;
	default: return reduce(depth - 1, prog, kind) + 3;
	}
}

static uint64_t eval(int depth, unsigned prog, int kind) { return next(depth, prog, kind) ^ 1; }
static uint64_t apply(int depth, unsigned prog, int kind) { return next(depth, prog, kind) ^ 2; }
static uint64_t reduce(int depth, unsigned prog, int kind) { return next(depth, prog, kind) ^ 3; }

int main(int argc, char **argv) {
	int seconds = argc > 1 ? atoi(argv[1]) : 15;
	devnull = open("/dev/null", O_WRONLY);
	time_t end = time(NULL) + seconds;
	unsigned r = 12345;
	while (time(NULL) < end) {
		r = r * 1103515245u + 12345u;
		/* next() and one of eval/apply/reduce make two frames per level. */
		int levels = 45 + (int)((r >> 8) % 16);
		sink += eval(levels, programs[(r >> 16) & 7], (int)(r >> 24));
	}
	return 0;
}
