package trace

// KernelStart is where the kernel half of the address space begins: with 48-bit virtual
// addresses, TTBR1 covers the top 2⁴⁸ bytes.
const KernelStart = 0xffff000000000000
