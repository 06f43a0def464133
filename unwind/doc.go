// Package unwind turns an object file's call frame information (.eh_frame, or .debug_frame
// where a file has none) into compact, sorted tables of rows that sonde's kernel unwinder
// walks: for each code range, how to find the canonical frame address (CFA), the return
// address and the caller's frame pointer. The CFA and frame pointer expressions compilers
// and hand-written assembly emit are evaluated symbolically into rows the kernel follows
// (expr.go). A Go binary's table describes the runtime's switches between stacks, read
// from its pclntab, with the runtime's layout (goruntime.go). Tables depend only on the
// file, so one table serves every process that maps it. A table goes to the kernel as it
// is built, a part at a time (stream.go), never whole in sonde's memory.
//
// Walk is the Go model of the kernel's walker (bpf/unwinder.h): the bpf package's tests
// run both on the same stacks and hold them to the same frames and ends.
package unwind
