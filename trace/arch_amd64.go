package trace

// KernelStart is where the kernel half of the address space begins: with 4-level paging,
// user addresses end below 2⁴⁷ and the kernel's canonical half begins here.
const KernelStart = 0xffff800000000000
