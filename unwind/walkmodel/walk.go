package walkmodel

import "github.com/sonde-profiler/sonde/unwind"

// Thread is what a walk starts from: the registers the sampled thread was interrupted
// with.
type Thread struct {
	// GPR holds the general-purpose registers by DWARF number (rax rdx rcx rbx rsi rdi
	// rbp rsp r8-r15).
	GPR [unwind.NumGPR]uint64
	PC  uint64
	// TLS is the thread pointer (FS base), where Go keeps the running g.
	TLS uint64
}

// KernelView is what the kernel walker reads besides the thread's memory: the process's
// mappings, sorted by Start, and its files' tables and Go runtime layouts by table id,
// nil for none.
type KernelView struct {
	Mappings  []unwind.KernelMapping
	Table     func(id uint32) []unwind.KernelRow
	GoRuntime func(id uint32) *unwind.KernelGoRuntime
}

// Walk is the Go model of the kernel's stack walker (bpf/unwinder.h), step for step: from
// the thread's registers, through the process's mappings and their files' tables, it
// returns the frames, leaf first, and how the walk ended. read returns the 8-byte word at
// an address.
func Walk(t Thread, k KernelView, read func(addr uint64) (uint64, bool)) ([]uint64, unwind.End) {
	gpr := t.GPR
	w := walker{
		k:     k,
		read:  read,
		regs:  Regs{PC: t.PC, SP: gpr[unwind.RegSP], FP: gpr[unwind.RegFP], Others: Others{Source: RegsLeaf, Leaf: &gpr}},
		tls:   t.TLS,
		exact: true,
	}
	end, done := unwind.EndTruncated, false
	for range unwind.MaxDepth + 1 {
		if end, done = w.step(); done {
			break
		}
	}
	switch {
	case !done:
		end = unwind.EndTruncated
	case end == unwind.EndComplete && w.usedFP:
		end = unwind.EndCompleteFP
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
func (w *walker) step() (unwind.End, bool) {
	if w.regs.PC == 0 {
		return unwind.EndComplete, true
	}
	if len(w.frames) >= unwind.MaxDepth {
		return unwind.EndTruncated, true
	}
	w.frames = append(w.frames, w.regs.PC)

	var row *unwind.Row
	var tableID uint32
	if m := findMapping(w.k.Mappings, w.regs.PC); m != nil && m.RowsCount > 0 {
		var rows []unwind.KernelRow
		if w.k.Table != nil {
			rows = w.k.Table(m.TableId)
		}
		if rows == nil {
			return unwind.EndTableGone, true
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
		if row == nil || row.CFA == unwind.CFAInvalid {
			return w.noRow()
		}
		w.guessed = false
	}
	if row == nil {
		return w.fpStep()
	}
	if row.CFA == unwind.CFAGo && !w.exact {
		return w.goStep(unwind.GoFunc(row.CFAReg), tableID)
	}
	if row.CFA == unwind.CFAGo || row.CFA == unwind.CFAFramePointer {
		// A switch interrupted in itself rather than returned to: its frame pointer leads on.
		return w.fpStep()
	}
	w.frameless = false

	next, res := Step(*row, w.regs, w.read)
	switch res {
	case StepEnd:
		return unwind.EndComplete, true
	case StepBadRead:
		return unwind.EndBadRead, true
	case StepNoRow:
		return w.noRow()
	case StepExpression:
		return unwind.EndCFAExpression, true
	case StepRegister:
		return unwind.EndRegister, true
	case StepRAElsewhere:
		return unwind.EndRARule, true
	case StepInvalid:
		return unwind.EndInvalid, true
	}
	if row.CFA == unwind.CFASignal {
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
func (w *walker) noRow() (unwind.End, bool) {
	if w.guessed {
		if len(w.frames) > 0 {
			w.frames = w.frames[:len(w.frames)-1]
		}
		return unwind.EndNoRow, true
	}
	if !w.exact {
		return unwind.EndNoRow, true
	}
	ra, ok := w.read(w.regs.SP)
	if !ok {
		return unwind.EndNoRow, true
	}
	w.guessed = true
	return w.advance(Regs{PC: ra, SP: w.regs.SP + 8, FP: w.regs.FP}, true)
}

// advance moves to the caller. Within one stack a caller's frame lies above its
// callee's; only the switches between stacks may go elsewhere.
func (w *walker) advance(next Regs, sameStack bool) (unwind.End, bool) {
	if sameStack && next.SP <= w.regs.SP && len(w.frames) > 1 {
		return unwind.EndNotAbove, true
	}
	next.Others = Others{}
	w.regs, w.exact = next, false
	return 0, false
}

// fpStep is fp_step: the caller of code without a table, by frame pointer; a zero frame
// pointer marks the outermost frame.
func (w *walker) fpStep() (unwind.End, bool) {
	w.usedFP = true
	if w.frameless {
		w.frameless = false
		ra, ok := w.read(w.regs.SP)
		if !ok {
			return unwind.EndFPBroken, true
		}
		return w.advance(Regs{PC: ra, SP: w.regs.SP + 8, FP: w.regs.FP}, true)
	}
	if w.regs.FP == 0 {
		return unwind.EndComplete, true
	}
	ra, ok1 := w.read(w.regs.FP + 8)
	fp, ok2 := w.read(w.regs.FP)
	if !ok1 || !ok2 {
		return unwind.EndFPBroken, true
	}
	return w.advance(Regs{PC: ra, SP: w.regs.FP + 16, FP: fp}, true)
}

// goStep is go_step: it follows a Go runtime function that switches stacks, or ends them,
// to the frame that called it.
func (w *walker) goStep(kind unwind.GoFunc, tableID uint32) (unwind.End, bool) {
	w.usedFP = true
	read := w.read
	switch kind {
	case unwind.GoFuncTop:
		return unwind.EndComplete, true
	case unwind.GoFuncFPSwitch:
		ra, ok1 := read(w.regs.FP + 8)
		fp, ok2 := read(w.regs.FP)
		if !ok1 || !ok2 {
			return unwind.EndGoSwitch, true
		}
		return w.advance(Regs{PC: ra, SP: w.regs.FP + 16, FP: fp}, false)
	}
	var rt *unwind.KernelGoRuntime
	if w.k.GoRuntime != nil {
		rt = w.k.GoRuntime(tableID)
	}
	if rt == nil {
		return unwind.EndGoSwitch, true
	}
	if kind == unwind.GoFuncAsmcgocall {
		g, ok1 := read(w.regs.SP + uint64(rt.CgoG))
		sp, ok2 := read(w.regs.SP + uint64(rt.CgoDepth))
		if !ok1 || !ok2 {
			return unwind.EndGoSwitch, true
		}
		if g != 0 {
			hi, ok := read(g + uint64(rt.G_stackHi))
			if !ok {
				return unwind.EndGoSwitch, true
			}
			sp = hi - sp
		}
		ra, ok := read(sp)
		if !ok {
			return unwind.EndGoSwitch, true
		}
		return w.advance(Regs{PC: ra, SP: sp + 8, FP: w.regs.FP}, false)
	}
	g, ok1 := read(w.tls + uint64(int64(rt.TlsG)))
	if !ok1 {
		return unwind.EndGoSwitch, true
	}
	m, ok2 := read(g + uint64(rt.G_m))
	if !ok2 {
		return unwind.EndGoSwitch, true
	}
	curg, ok3 := read(m + uint64(rt.M_curg))
	if !ok3 {
		return unwind.EndGoSwitch, true
	}
	if curg == 0 {
		// newstack preempted the goroutine; the scheduler runs for none.
		if kind == unwind.GoFuncMorestack {
			return unwind.EndComplete, true
		}
		return unwind.EndGoSwitch, true
	}
	sched := curg + uint64(rt.G_sched)
	sp, ok4 := read(sched + uint64(rt.GobufSp))
	fp, ok5 := read(sched + uint64(rt.GobufBp))
	if !ok4 || !ok5 {
		return unwind.EndGoSwitch, true
	}
	switch kind {
	case unwind.GoFuncSystemstack:
		if sp == fp {
			// systemstack's own frame: the caller's frame pointer, then the return address.
			callerFP, ok1 := read(fp)
			ra, ok2 := read(fp + 8)
			if !ok1 || !ok2 {
				return unwind.EndGoSwitch, true
			}
			return w.advance(Regs{PC: ra, SP: fp + 16, FP: callerFP}, false)
		}
		ra, ok := read(sp)
		if !ok {
			return unwind.EndGoSwitch, true
		}
		return w.advance(Regs{PC: ra, SP: sp + 8, FP: fp}, false)
	case unwind.GoFuncMorestack:
		status, ok := read(curg + uint64(rt.G_status))
		if !ok {
			return unwind.EndGoSwitch, true
		}
		if status&0xffffffff&^gScan == gCopystack {
			// newstack is copying the goroutine's stack: no state to walk.
			return unwind.EndComplete, true
		}
		pc, ok := read(sched + uint64(rt.GobufPc))
		if !ok {
			return unwind.EndGoSwitch, true
		}
		end, done := w.advance(Regs{PC: pc, SP: sp, FP: fp}, false)
		w.frameless = true
		return end, done
	}
	return unwind.EndInvalid, true
}

// findMapping is the kernel's binary search over a process's mappings: at most
// MaxMappings of them, in ten halvings.
func findMapping(ms []unwind.KernelMapping, pc uint64) *unwind.KernelMapping {
	lo, hi := 0, min(len(ms), unwind.MaxMappings)
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
func findRow(rows []unwind.KernelRow, count uint32, vaddr uint32) (unwind.Row, bool) {
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
		return unwind.Row{}, false
	}
	return rows[lo-1].Row(), true
}

// The Go runtime's goroutine states: being copied, and the garbage collector's scan bit.
const (
	gCopystack = 8
	gScan      = 0x1000
)
