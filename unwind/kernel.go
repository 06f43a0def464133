package unwind

import (
	"structs"
)

// End says how a walk of a user stack ended. The values are the kernel's enum unwind_end
// (bpf/types.h); a test holds the two together.
type End uint8

const (
	EndComplete      End = iota // reached the outermost frame, every frame by its table
	EndCompleteFP               // reached the outermost frame; code without a table by frame pointer
	EndTruncated                // MaxDepth frames and still going
	EndNoUser                   // a kernel thread: no user stack
	EndFPBroken                 // code without a table, and its frame pointer led nowhere readable
	EndBadRead                  // a table's rule named memory that could not be read
	EndNoRow                    // in a file with a table, outside every function it describes
	EndCFAExpression            // a CFA expression the walker does not evaluate
	EndRegister                 // a rule needs a register the frame does not know
	EndRARule                   // the return address is not at CFA-8
	EndNotAbove                 // the caller's frame does not lie above its callee's
	EndTableGone                // the file's table is no longer in the kernel
	EndGoSwitch                 // a Go stack switch could not be followed
	EndInvalid                  // a rule the walker does not know
	// EndCount is how many ways a walk can end: UNWIND_END_MAX.
	EndCount int = iota
)

// MaxDepth is how many user frames the kernel walks at most: MAX_USER_DEPTH.
const MaxDepth = 256

// MaxMappings is how many mappings of a process the kernel holds: MAX_PROC_MAPPINGS.
const MaxMappings = 256

// KernelMapping is an executable mapping as the kernel unwinder stores it: struct
// exec_mapping of bpf/types.h, field for field, so that bpf.ExecMapping converts to it.
type KernelMapping struct {
	_         structs.HostLayout
	Start     uint64
	End       uint64
	Bias      uint64 // runtime address - ELF virtual address
	TableId   uint32 // the file's table, as the kernel numbers tables
	RowsCount uint32 // 0: no table, walk by frame pointer
}

// KernelGoRuntime is a Go binary's runtime layout as the kernel walker reads it: struct
// go_runtime of bpf/types.h, field for field, so that bpf.GoRuntime converts to it.
type KernelGoRuntime struct {
	_         structs.HostLayout
	TlsG      int32 // the running g is at the thread pointer + TlsG
	G_m       uint16
	G_sched   uint16
	M_curg    uint16
	G_status  uint16 // offsetof(g, atomicstatus)
	GobufSp   uint8
	GobufPc   uint8
	GobufBp   uint8
	G_stackHi uint8
	CgoDepth  uint8 // where asmcgocall keeps the goroutine's stack depth, from its SP at the call
	CgoG      uint8 // and the goroutine
}
