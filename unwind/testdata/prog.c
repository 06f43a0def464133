// Test program for unwind's ground-truth tests: built with -O2 -fomit-frame-pointer, so
// most functions keep the CFA on rsp, while alloca and VLAs force it onto rbp.
#include <alloca.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) long vla_sum(int n) {
	long v[n];
	for (int i = 0; i < n; i++)
		v[i] = i * 3;
	long s = 0;
	for (int i = 0; i < n; i++)
		s += v[i];
	return s;
}

__attribute__((noinline)) long alloca_sum(int n) {
	char *p = alloca(n);
	memset(p, 1, n);
	long s = 0;
	for (int i = 0; i < n; i++)
		s += p[i];
	return s + vla_sum(n);
}

// A large fixed frame: def_cfa_offset beyond one byte.
__attribute__((noinline)) long big_frame(int n) {
	volatile char buf[70000];
	for (int i = 0; i < n && i < (int)sizeof buf; i++)
		buf[i] = (char)i;
	return buf[n % sizeof buf];
}

static void release(char **p) { free(*p); }

// A cleanup under -fexceptions gives the FDE a personality and an LSDA ("zPLR").
__attribute__((noinline)) long with_cleanup(int n) {
	__attribute__((cleanup(release))) char *p = malloc(n + 1);
	if (!p)
		return 0;
	memset(p, 'x', n);
	p[n] = 0;
	return (long)strlen(p) + big_frame(n);
}

int main(int argc, char **argv) {
	int n = argc > 1 ? atoi(argv[1]) : 100;
	printf("%ld\n", alloca_sum(n) + with_cleanup(n));
	return 0;
}
