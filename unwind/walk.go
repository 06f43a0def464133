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

// maxMappings is how many mappings of a process the kernel holds: MAX_PROC_MAPPINGS.
const maxMappings = 256

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

// Thread is what a walk starts from: the registers the sampled thread was interrupted
// with.
type Thread struct {
	// GPR holds the general-purpose registers by DWARF number (rax rdx rcx rbx rsi rdi
	// rbp rsp r8-r15).
	GPR [numGPR]uint64
	PC  uint64
	// TLS is the thread pointer (FS base), where Go keeps the running g.
	TLS uint64
}

// KernelView is what the kernel walker reads besides the thread's memory: the process's
// mappings, sorted by Start, and its files' tables and Go runtime layouts by table id,
// nil for none.
type KernelView struct {
	Mappings  []KernelMapping
	Table     func(id uint32) []KernelRow
	GoRuntime func(id uint32) *KernelGoRuntime
}

// Walk is the Go model of the kernel's stack walker (bpf/unwinder.h), step for step: from
// the thread's registers, through the process's mappings and their files' tables, it
// returns the frames, leaf first, and how the walk ended. read returns the 8-byte word at
// an address.
func Walk(t Thread, k KernelView, read func(addr uint64) (uint64, bool)) ([]uint64, End) {
	gpr := t.GPR
	w := walker{
		k:     k,
		read:  read,
		regs:  Regs{PC: t.PC, SP: gpr[regSP], FP: gpr[regFP], Others: Others{Source: RegsLeaf, Leaf: &gpr}},
		tls:   t.TLS,
		exact: true,
	}
	end, done := EndTruncated, false
	for range MaxDepth + 1 {
		if end, done = w.step(); done {
			break
		}
	}
	switch {
	case !done:
		end = EndTruncated
	case end == EndComplete && w.usedFP:
		end = EndCompleteFP
	}
	return w.frames, end
}

// walker is struct unwind_state.
type walker struct {
	k      KernelView
	read   func(uint64) (uint64, bool)
	frames []uint64
	regs   Regs
	tls    uint64
	exact  bool // regs.PC is an interrupted instruction, not a return address
	usedFP bool
	// frameless: the frame's function was stopped in its prologue (Go's morestack): its
	// return address is at SP.
	frameless bool
	// guessed: the frame's PC was read from SP of an interrupted routine no row describes
	// (noRow), kept only if a row describes the PC.
	guessed bool
}

// step is walker_step: it records the current frame and moves to its caller, or says
// how the walk ends.
func (w *walker) step() (End, bool) {
	if w.regs.PC == 0 {
		return EndComplete, true
	}
	if len(w.frames) >= MaxDepth {
		return EndTruncated, true
	}
	w.frames = append(w.frames, w.regs.PC)

	var row *Row
	var tableID uint32
	if m := findMapping(w.k.Mappings, w.regs.PC); m != nil && m.RowsCount > 0 {
		var rows []KernelRow
		if w.k.Table != nil {
			rows = w.k.Table(m.TableId)
		}
		if rows == nil {
			return EndTableGone, true
		}
		back := uint64(1)
		if w.exact {
			back = 0
		}
		r, ok := findRow(rows, m.RowsCount, uint32(w.regs.PC-m.Bias-back))
		if !ok {
			return w.noRow()
		}
		row, tableID = &r, m.TableId
	}
	if w.guessed {
		if row == nil || row.CFA == CFAInvalid {
			return w.noRow()
		}
		w.guessed = false
	}
	if row == nil {
		return w.fpStep()
	}
	if row.CFA == CFAGo && !w.exact {
		return w.goStep(GoFunc(row.CFAReg), tableID)
	}
	if row.CFA == CFAGo || row.CFA == CFAFramePointer {
		// A switch interrupted in itself rather than returned to: its frame pointer leads on.
		return w.fpStep()
	}
	w.frameless = false

	next, res := Step(*row, w.regs, w.read)
	switch res {
	case StepEnd:
		return EndComplete, true
	case StepBadRead:
		return EndBadRead, true
	case StepNoRow:
		return w.noRow()
	case StepExpression:
		return EndCFAExpression, true
	case StepRegister:
		return EndRegister, true
	case StepRAElsewhere:
		return EndRARule, true
	case StepInvalid:
		return EndInvalid, true
	}
	if row.CFA == CFASignal {
		// The interrupted frame's PC is exact, and its stack may lie anywhere.
		w.regs, w.exact = next, true
		return 0, false
	}
	return w.advance(next, true)
}

// noRow is no_row: from a frame no row describes, an interrupted routine (assembly
// without call frame information) is taken for a leaf that pushed nothing, its return
// address at SP, which the next step keeps only if a row describes it; a frame so
// guessed is taken back, and the walk ends.
func (w *walker) noRow() (End, bool) {
	if w.guessed {
		if len(w.frames) > 0 {
			w.frames = w.frames[:len(w.frames)-1]
		}
		return EndNoRow, true
	}
	if !w.exact {
		return EndNoRow, true
	}
	ra, ok := w.read(w.regs.SP)
	if !ok {
		return EndNoRow, true
	}
	w.guessed = true
	return w.advance(Regs{PC: ra, SP: w.regs.SP + 8, FP: w.regs.FP}, true)
}

// advance moves to the caller. Within one stack a caller's frame lies above its
// callee's; only the switches between stacks may go elsewhere.
func (w *walker) advance(next Regs, sameStack bool) (End, bool) {
	if sameStack && next.SP <= w.regs.SP && len(w.frames) > 1 {
		return EndNotAbove, true
	}
	next.Others = Others{}
	w.regs, w.exact = next, false
	return 0, false
}

// fpStep is fp_step: the caller of code without a table, by frame pointer; a zero frame
// pointer marks the outermost frame.
func (w *walker) fpStep() (End, bool) {
	w.usedFP = true
	if w.frameless {
		w.frameless = false
		ra, ok := w.read(w.regs.SP)
		if !ok {
			return EndFPBroken, true
		}
		return w.advance(Regs{PC: ra, SP: w.regs.SP + 8, FP: w.regs.FP}, true)
	}
	if w.regs.FP == 0 {
		return EndComplete, true
	}
	ra, ok1 := w.read(w.regs.FP + 8)
	fp, ok2 := w.read(w.regs.FP)
	if !ok1 || !ok2 {
		return EndFPBroken, true
	}
	return w.advance(Regs{PC: ra, SP: w.regs.FP + 16, FP: fp}, true)
}

// goStep is go_step: it follows a Go runtime function that switches stacks, or ends them,
// to the frame that called it.
func (w *walker) goStep(kind GoFunc, tableID uint32) (End, bool) {
	w.usedFP = true
	read := w.read
	switch kind {
	case GoFuncTop:
		return EndComplete, true
	case GoFuncFPSwitch:
		ra, ok1 := read(w.regs.FP + 8)
		fp, ok2 := read(w.regs.FP)
		if !ok1 || !ok2 {
			return EndGoSwitch, true
		}
		return w.advance(Regs{PC: ra, SP: w.regs.FP + 16, FP: fp}, false)
	}
	var rt *KernelGoRuntime
	if w.k.GoRuntime != nil {
		rt = w.k.GoRuntime(tableID)
	}
	if rt == nil {
		return EndGoSwitch, true
	}
	if kind == GoFuncAsmcgocall {
		g, ok1 := read(w.regs.SP + uint64(rt.CgoG))
		sp, ok2 := read(w.regs.SP + uint64(rt.CgoDepth))
		if !ok1 || !ok2 {
			return EndGoSwitch, true
		}
		if g != 0 {
			hi, ok := read(g + uint64(rt.G_stackHi))
			if !ok {
				return EndGoSwitch, true
			}
			sp = hi - sp
		}
		ra, ok := read(sp)
		if !ok {
			return EndGoSwitch, true
		}
		return w.advance(Regs{PC: ra, SP: sp + 8, FP: w.regs.FP}, false)
	}
	g, ok1 := read(w.tls + uint64(int64(rt.TlsG)))
	if !ok1 {
		return EndGoSwitch, true
	}
	m, ok2 := read(g + uint64(rt.G_m))
	if !ok2 {
		return EndGoSwitch, true
	}
	curg, ok3 := read(m + uint64(rt.M_curg))
	if !ok3 {
		return EndGoSwitch, true
	}
	if curg == 0 {
		// newstack preempted the goroutine; the scheduler runs for none.
		if kind == GoFuncMorestack {
			return EndComplete, true
		}
		return EndGoSwitch, true
	}
	sched := curg + uint64(rt.G_sched)
	sp, ok4 := read(sched + uint64(rt.GobufSp))
	fp, ok5 := read(sched + uint64(rt.GobufBp))
	if !ok4 || !ok5 {
		return EndGoSwitch, true
	}
	switch kind {
	case GoFuncSystemstack:
		if sp == fp {
			// systemstack's own frame: the caller's frame pointer, then the return address.
			callerFP, ok1 := read(fp)
			ra, ok2 := read(fp + 8)
			if !ok1 || !ok2 {
				return EndGoSwitch, true
			}
			return w.advance(Regs{PC: ra, SP: fp + 16, FP: callerFP}, false)
		}
		ra, ok := read(sp)
		if !ok {
			return EndGoSwitch, true
		}
		return w.advance(Regs{PC: ra, SP: sp + 8, FP: fp}, false)
	case GoFuncMorestack:
		status, ok := read(curg + uint64(rt.G_status))
		if !ok {
			return EndGoSwitch, true
		}
		if status&0xffffffff&^gScan == gCopystack {
			// newstack is copying the goroutine's stack: no state to walk.
			return EndComplete, true
		}
		pc, ok := read(sched + uint64(rt.GobufPc))
		if !ok {
			return EndGoSwitch, true
		}
		end, done := w.advance(Regs{PC: pc, SP: sp, FP: fp}, false)
		w.frameless = true
		return end, done
	}
	return EndInvalid, true
}

// findMapping is the kernel's binary search over a process's mappings: at most
// maxMappings of them, in ten halvings.
func findMapping(ms []KernelMapping, pc uint64) *KernelMapping {
	lo, hi := 0, min(len(ms), maxMappings)
	for range 10 {
		if lo >= hi {
			break
		}
		mid := lo + (hi-lo)/2
		if ms[mid].Start <= pc {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return nil
	}
	m := &ms[lo-1]
	if pc >= m.End || pc < m.Start {
		return nil
	}
	return m
}

// findRow is the kernel's search for the last of count rows at or below vaddr, in 25
// halvings. Like the kernel's, it stops where the table has no row at an index (a count
// larger than the table), and it returns rows whose rule is CFAInvalid, which Step then
// refuses.
func findRow(rows []KernelRow, count uint32, vaddr uint32) (Row, bool) {
	lo, hi := uint32(0), count
	for range 25 {
		if lo >= hi {
			break
		}
		mid := lo + (hi-lo)/2
		if int(mid) >= len(rows) {
			break
		}
		if rows[mid].Pc <= vaddr {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return Row{}, false
	}
	return rows[lo-1].Row(), true
}

// The Go runtime's goroutine states: being copied, and the garbage collector's scan bit.
const (
	gCopystack = 8
	gScan      = 0x1000
)

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
