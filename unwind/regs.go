package unwind

// NumGPR is how many general-purpose registers DWARF numbers before the return address
// column: rax rdx rcx rbx rsi rdi rbp rsp r8-r15 on x86-64.
const NumGPR = 16
