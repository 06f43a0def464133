/* The workload of TestCapabilities: one named function that burns CPU forever. */
__attribute__((noinline)) unsigned long sonde_cap_burn(unsigned long n) {
	volatile unsigned long x = 0;
	for (unsigned long i = 0; i < n; i++) x += i * i;
	return x;
}

int main(void) {
	for (;;) sonde_cap_burn(100000000UL);
}
