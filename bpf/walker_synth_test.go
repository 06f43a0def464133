//go:build amd64

package bpf

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sonde-profiler/sonde/unwind"
	"github.com/sonde-profiler/sonde/unwind/walkmodel"
)

// TestWalkersAgreeSynthetic builds stacks frame by frame from random tables, so that
// walks go deep through every rule (registers, dereferences, signal frames, PLT entries,
// Go's stack switches), then damages some of them (words, regions, rows, tables) so that
// every way a walk can end is reached too.
func TestWalkersAgreeSynthetic(t *testing.T) {
	const n = 2500
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	cases := make([]*walkCase, 0, n)
	for i := range n {
		g := newSynth(r)
		c := g.build(fmt.Sprintf("synthetic %d (seed %d)", i, seed))
		g.damage(c)
		cases = append(cases, c)
	}
	res := compareWalkers(t, cases)

	// The cases must reach every end and go deep, or the agreement means little.
	ends := map[UnwindEnd]int{}
	deep, guessKept, guessDropped := 0, 0, 0
	for i, r := range res {
		ends[UnwindEnd(r.end)]++
		if len(r.frames) >= 20 {
			deep++
		}
		if cases[i].guess != 0 && len(r.frames) > 0 && r.frames[0] == cases[i].thread.PC {
			if len(r.frames) > 1 && r.frames[1] == cases[i].guess {
				guessKept++
			} else if len(r.frames) == 1 && UnwindEnd(r.end) == UnwindNoRow {
				guessDropped++
			}
		}
	}
	// Leaves in no function: walks that went on from the caller at sp, and walks that
	// took that caller back because no row describes it.
	if guessKept == 0 || guessDropped == 0 {
		t.Errorf("leaves outside every function: %d walks kept the caller at sp, %d took it back; want some of each", guessKept, guessDropped)
	}
	for end := range UnwindEndCount {
		if UnwindEnd(end) == UnwindNoUser {
			continue // decided before the walk starts
		}
		if ends[UnwindEnd(end)] == 0 {
			t.Errorf("no synthetic walk ended %s", UnwindEnd(end))
		}
	}
	if deep < n/10 {
		t.Errorf("only %d of %d walks reached 20 frames", deep, n)
	}
	t.Logf("ends %v, %d walks of 20 frames or more; leaves outside every function: %d kept the caller at sp, %d took it back",
		ends, deep, guessKept, guessDropped)
}

const (
	synthStackTop = 0x7ffd_0000_0000
	synthHeap     = 0xc000_0000_00
	synthCodeSize = 0x10000
)

// synthFile is a mapped file and its table; a Go binary's has a runtime layout too.
type synthFile struct {
	m    unwind.KernelMapping
	rows []unwind.KernelRow
	isGo bool
}

// synth builds one case. Values the walk reads (the frame pointer, registers, saved
// words) are chosen as late as possible, when a rule first needs them, so that the
// stack is consistent with the rules that read it.
type synth struct {
	r     *rand.Rand
	files []*synthFile
	goRT  map[uint32]*unwind.KernelGoRuntime
	words map[uint64]uint64

	// The frame being laid out.
	pc, sp    uint64
	exact     bool
	frameless bool
	// fp is the frame pointer; while fpFree it has not been chosen, and will be written
	// where it was read from (fpSlot) or, for the leaf, into the thread's registers.
	fp     uint64
	fpFree bool
	fpSlot uint64
	// Where the frame's other registers are: the leaf's, a ucontext's, or none.
	regsLeaf bool
	uc       uint64
	regSet   map[uint8]bool // registers of the frame already chosen

	thread walkmodel.Thread
	// The Go runtime objects all switches of the walk read.
	g, m, curg uint64
	// healthy cases pick only code whose rows lead on: long walks.
	healthy bool
	// guess: the caller guessed for the leaf (guessFrame), or 0.
	guess uint64
}

func newSynth(r *rand.Rand) *synth {
	g := &synth{r: r, words: map[uint64]uint64{}, goRT: map[uint32]*unwind.KernelGoRuntime{}, healthy: r.IntN(5) < 3}
	nfiles := 1 + r.IntN(5)
	start := uint64(0x40_0000)
	for i := range nfiles {
		start += uint64(1+r.IntN(64)) << 16
		f := &synthFile{m: unwind.KernelMapping{Start: start, End: start + synthCodeSize, TableId: uint32(i)}, isGo: r.IntN(3) == 0}
		vbase := uint64(r.IntN(4)) << 20
		f.m.Bias = start - vbase
		if r.IntN(8) > 0 {
			f.rows = g.rows(vbase, f.isGo)
			f.m.RowsCount = uint32(len(f.rows))
		}
		if f.isGo {
			g.goRT[f.m.TableId] = g.goRuntime()
		}
		g.files = append(g.files, f)
		start = f.m.End
	}
	return g
}

// goRuntime makes a plausible layout: the offsets of real Go releases, now and then others.
func (g *synth) goRuntime() *unwind.KernelGoRuntime {
	rt := &unwind.KernelGoRuntime{TlsG: -8, G_m: 48, G_sched: 56, M_curg: 0xb8, G_status: 144, GobufSp: 0, GobufPc: 8, GobufBp: 40, G_stackHi: 8, CgoDepth: 0, CgoG: 8}
	if g.r.IntN(3) == 0 {
		rt.TlsG, rt.M_curg, rt.G_status, rt.GobufBp, rt.CgoDepth, rt.CgoG = -16, 0xc0, 152, 48, 40, 48
	}
	return rt
}

// rows makes a table for code at vbase: functions of one to four rows, with gaps.
func (g *synth) rows(vbase uint64, isGo bool) []unwind.KernelRow {
	var rows []unwind.KernelRow
	pc := vbase + uint64(g.r.IntN(64))
	if isGo {
		pc = vbase
	}
	for pc < vbase+synthCodeSize {
		for range 1 + g.r.IntN(4) {
			if isGo {
				rows = append(rows, g.goRow(uint32(pc)))
			} else {
				rows = append(rows, g.row(uint32(pc)))
			}
			pc += 1 + uint64(g.r.IntN(1600))
		}
		if g.r.IntN(6) == 0 {
			rows = append(rows, unwind.KernelRow{Pc: uint32(pc)}) // a gap between FDEs
			pc += 1 + uint64(g.r.IntN(64))
		}
	}
	return rows
}

// goRow is a row of a Go binary's table: frame pointers, the runtime's switches, and
// the few rows of its assembly and cgo's C code.
func (g *synth) goRow(pc uint32) unwind.KernelRow {
	switch x := g.r.IntN(100); {
	case x < 50:
		return unwind.KernelRow{Pc: pc, CfaRule: CFAFramePointer}
	case x < 85:
		kind := uint8(1 + g.r.IntN(GoFuncCount-1))
		if g.r.IntN(30) == 0 {
			kind = uint8(GoFuncCount + g.r.IntN(3)) // a kind the walker does not know
		}
		return unwind.KernelRow{Pc: pc, CfaRule: CFAGo, CfaReg: kind}
	}
	return g.row(pc)
}

func (g *synth) row(pc uint32) unwind.KernelRow {
	r := unwind.KernelRow{Pc: pc}
	switch x := g.r.IntN(100); {
	case x < 45:
		r.CfaRule = CFASP
		r.CfaOffset = int32(8 * (1 + g.r.IntN(16)))
		if g.r.IntN(20) == 0 {
			r.CfaOffset = int32(8 * (1 + g.r.IntN(1024))) // a large frame
		}
	case x < 58:
		r.CfaRule = CFAFP
		r.CfaOffset = 16
		if g.r.IntN(4) == 0 {
			r.CfaOffset = int32(8 * (g.r.IntN(8) - 2))
		}
	case x < 63:
		r.CfaRule = CFAReg
		r.CfaReg = g.reg()
		r.CfaOffset = int32(8 * g.r.IntN(8))
	case x < 72:
		r.CfaRule = CFADeref
		r.CfaReg = g.reg()
		r.CfaOffset = int32(8 * (g.r.IntN(16) - 4))
		if g.r.IntN(3) == 0 {
			r.CfaIndex = unwind.CFAIndex | uint8(g.r.IntN(4))<<4 | g.reg()&15
		}
		r.CfaPost = int16(8 * g.r.IntN(4))
	case x < 76:
		r.CfaRule = CFAPLT
	case x < 80:
		r.CfaRule = CFASignal
	case x < 84:
		r.CfaRule = CFAEndOfStack
	case x < 87:
		r.CfaRule = CFASP
		r.CfaOffset = int32(8 * (g.r.IntN(4) - 2)) // the caller below its callee
	case x < 89:
		r.CfaRule = CFAExpression
	case x < 91:
		r.CfaRule = CFARAElsewhere
	case x < 93:
		r.CfaRule = CFAFramePointer
	case x < 95:
		r.CfaRule = uint8(CFARuleCount + g.r.IntN(4)) // a rule the walker does not know
	default:
		r.CfaRule = CFAInvalid
	}
	switch r.CfaRule {
	case CFASP, CFAFP, CFAReg, CFADeref:
		switch x := g.r.IntN(20); {
		case x < 7:
			r.FpRule = FPAtCFA
			r.FpOffset = int16(-8 * (2 + g.r.IntN(6)))
		case x < 9:
			r.FpRule = FPAtFP
			r.FpOffset = int16(8 * (g.r.IntN(4) - 1))
		case x < 11:
			r.FpRule = FPAtSP
			r.FpOffset = int16(8 * g.r.IntN(8))
		case x < 13:
			r.FpRule = FPInvalid
		case x < 14:
			r.FpRule = uint8(FPRuleCount + g.r.IntN(3))
		}
	}
	return r
}

// reg picks a register for a rule: mostly rsp and rbp, some others, now and then one
// beyond the general-purpose registers.
func (g *synth) reg() uint8 {
	switch x := g.r.IntN(20); {
	case x < 6:
		return 7
	case x < 10:
		return 6
	case x < 19:
		return uint8(g.r.IntN(16))
	}
	return uint8(16 + g.r.IntN(20))
}

// lookup finds the row the walker will use for pc, as the kernel does; ok is false
// where the walk ends for want of a row or table.
func (g *synth) lookup(pc uint64, exact bool) (row *unwind.KernelRow, f *synthFile, ok bool) {
	for _, f := range g.files {
		if pc < f.m.Start || pc >= f.m.End {
			continue
		}
		if f.m.RowsCount == 0 {
			return nil, f, true
		}
		v := pc - f.m.Bias
		if !exact {
			v--
		}
		i, found := slices.BinarySearchFunc(f.rows, uint32(v), func(r unwind.KernelRow, v uint32) int {
			if r.Pc <= v {
				return -1
			}
			return 1
		})
		if found || i == 0 {
			return nil, f, false
		}
		return &f.rows[i-1], f, true
	}
	return nil, nil, true
}

// codeAddr picks an address for a frame: in a file, at a row's start now and then (where
// looking up pc and pc-1 differ), or in anonymous memory.
func (g *synth) codeAddr() uint64 {
	for range 20 {
		pc := g.anyCodeAddr()
		if !g.healthy {
			return pc
		}
		row, _, ok := g.lookup(pc, false)
		switch {
		case !ok:
		case row == nil, row.CfaRule == CFAFramePointer:
			return pc
		case row.CfaRule == CFASP && row.CfaOffset > 0, row.CfaRule == CFAFP && row.CfaOffset > 0:
			return pc
		case row.CfaRule == CFADeref && row.CfaReg == 7 && row.CfaIndex == 0:
			return pc
		case row.CfaRule == CFAGo && row.CfaReg != GoFuncTop && int(row.CfaReg) < GoFuncCount:
			return pc
		case row.CfaRule == CFAPLT || row.CfaRule == CFASignal:
			if g.r.IntN(4) == 0 {
				return pc
			}
		}
	}
	return g.anyCodeAddr()
}

func (g *synth) anyCodeAddr() uint64 {
	if g.r.IntN(10) == 0 {
		return 0x7f00_0000_0000 + uint64(g.r.IntN(1<<20))
	}
	f := g.files[g.r.IntN(len(g.files))]
	if len(f.rows) > 0 && g.r.IntN(5) == 0 {
		return uint64(f.rows[g.r.IntN(len(f.rows))].Pc) + f.m.Bias
	}
	return f.m.Start + uint64(g.r.IntN(synthCodeSize))
}

// frame pointer of the frame, chosen now if nothing fixed it yet.
func (g *synth) framePointer() uint64 {
	if g.fpFree {
		g.fp = g.sp + 8*uint64(2+g.r.IntN(16))
		if !g.healthy && g.r.IntN(50) == 0 {
			g.fp = 0
		}
		g.setFP(g.fp)
	}
	return g.fp
}

func (g *synth) setFP(v uint64) {
	g.fp, g.fpFree = v, false
	if g.fpSlot != 0 {
		g.words[g.fpSlot] = v
	} else {
		g.thread.GPR[6] = v
	}
}

// register of the frame by DWARF number, chosen now if free; ok is false where the frame
// does not know it.
func (g *synth) register(n uint8, near uint64) (uint64, bool) {
	switch {
	case n == 7:
		return g.sp, true
	case n == 6:
		return g.framePointer(), true
	case n >= 16 || (!g.regsLeaf && g.uc == 0):
		return 0, false
	}
	var slot *uint64
	var ucAddr uint64
	if g.regsLeaf {
		slot = &g.thread.GPR[n]
	} else {
		ucAddr = g.uc + ucontextOffsets[n]
	}
	if !g.regSet[n] {
		g.regSet[n] = true
		v := near + 8*uint64(g.r.IntN(16))
		if slot != nil {
			*slot = v
		} else {
			g.words[ucAddr] = v
		}
	}
	if slot != nil {
		return *slot, true
	}
	return g.words[ucAddr], true
}

// ucontextOffsets is glibc's layout of the registers in a ucontext, by DWARF number.
var ucontextOffsets = [16]uint64{144, 136, 152, 128, 112, 104, 120, 160, 40, 48, 56, 64, 72, 80, 88, 96}

// goObjects places the g in TLS, its m and the goroutine the m runs, once per case.
func (g *synth) goObjects(rt *unwind.KernelGoRuntime) bool {
	if g.curg != 0 {
		return true
	}
	if g.thread.TLS == 0 {
		g.thread.TLS = synthHeap + 0x1000_0000 + uint64(g.r.IntN(1<<16))*8
	}
	tlsSlot := g.thread.TLS + uint64(int64(rt.TlsG))
	if v, ok := g.words[tlsSlot]; ok {
		g.g = v
	} else {
		g.g = synthHeap + uint64(g.r.IntN(1<<20))*8
		g.words[tlsSlot] = g.g
	}
	g.m = synthHeap + 0x100_0000 + uint64(g.r.IntN(1<<16))*8
	g.curg = synthHeap + 0x200_0000 + uint64(g.r.IntN(1<<16))*8
	if g.r.IntN(20) == 0 {
		g.curg = 0 // no goroutine: scheduler work
	}
	g.words[g.g+uint64(rt.G_m)] = g.m
	g.words[g.m+uint64(rt.M_curg)] = g.curg
	return g.curg != 0
}

// newStack is a stack somewhere else: a goroutine's, g0's, a signal handler's.
func (g *synth) newStack() uint64 {
	return synthStackTop - uint64(1+g.r.IntN(8))<<20 - uint64(g.r.IntN(1<<12))&^7
}

// next moves the frame being laid out to its caller.
func (g *synth) next(pc, sp uint64, exact bool) {
	g.pc, g.sp, g.exact = pc, sp, exact
	g.regsLeaf, g.uc = false, 0
	g.regSet = map[uint8]bool{}
}

// returnAddress is where the caller resumes: mostly code, now and then zero (the end).
func (g *synth) returnAddress() uint64 {
	if !g.healthy && g.r.IntN(100) == 0 {
		return 0
	}
	return g.codeAddr()
}

// build lays out a stack from the leaf up, writing each frame as its row says the
// walker will read it.
func (g *synth) build(name string) *walkCase {
	c := &walkCase{name: name, tables: map[uint32][]unwind.KernelRow{}, goRT: g.goRT}
	for _, f := range g.files {
		c.maps = append(c.maps, f.m)
		if f.m.RowsCount > 0 {
			c.tables[f.m.TableId] = f.rows
		}
	}
	for i := range g.thread.GPR {
		g.thread.GPR[i] = g.r.Uint64() >> g.r.IntN(64)
	}
	g.thread.PC = g.codeAddr()
	g.next(g.thread.PC, synthStackTop-uint64(g.r.IntN(1<<16))&^7, true)
	g.thread.GPR[7] = g.sp
	g.regsLeaf, g.fpFree = true, true
	for range 1 + g.r.IntN(300) {
		if !g.frame() {
			break
		}
	}
	if g.fpFree {
		g.framePointer()
	}
	c.thread = g.thread
	c.mem = g.memory()
	c.guess = g.guess
	return c
}

// frame lays out the current frame so that the walker reaches its caller, and moves
// there; false where the walk ends.
func (g *synth) frame() bool {
	row, f, ok := g.lookup(g.pc, g.exact)
	if (!ok && f != nil) || (row != nil && row.CfaRule == CFAInvalid) {
		return g.guessFrame()
	}
	if !ok {
		return false
	}
	if row == nil || row.CfaRule == CFAFramePointer || (row.CfaRule == CFAGo && g.exact) {
		return g.fpFrame(true)
	}
	if row.CfaRule == CFAGo {
		return g.goFrame(unwind.GoFunc(row.CfaReg), g.goRT[f.m.TableId])
	}
	g.frameless = false
	var cfa uint64
	switch row.CfaRule {
	case CFASP:
		cfa = g.sp + uint64(int64(row.CfaOffset))
	case CFAFP:
		cfa = g.framePointer() + uint64(int64(row.CfaOffset))
	case CFAReg:
		v, ok := g.register(row.CfaReg, g.sp+8)
		if !ok {
			return false
		}
		cfa = v + uint64(int64(row.CfaOffset))
	case CFADeref:
		base, ok := g.register(row.CfaReg, g.sp)
		if !ok {
			return false
		}
		addr := base + uint64(int64(row.CfaOffset))
		if row.CfaIndex&unwind.CFAIndex != 0 {
			x, ok := g.register(row.CfaIndex&15, 0)
			if !ok {
				return false
			}
			addr += x << ((row.CfaIndex >> 4) & 3)
		}
		if v, ok := g.words[addr]; ok {
			cfa = v + uint64(int64(row.CfaPost))
		} else {
			cfa = g.sp + 8*uint64(2+g.r.IntN(16))
			g.words[addr] = cfa - uint64(int64(row.CfaPost))
		}
	case CFAPLT:
		cfa = g.sp + 8
		if g.pc&15 >= 11 {
			cfa += 8
		}
	case CFASignal:
		uc := g.sp
		pc, sp := g.codeAddr(), g.newStack()
		if g.r.IntN(8) == 0 {
			sp = uc + 8*uint64(g.r.IntN(64)) // the interrupted frame on the same stack
		}
		g.words[uc+168], g.words[uc+160] = pc, sp
		g.next(pc, sp, true)
		g.uc, g.fpSlot, g.fpFree = uc, uc+120, true
		return true
	default:
		return false
	}
	ra := g.returnAddress()
	g.words[cfa-8] = ra
	fpSlot, fpFree := g.fpSlot, g.fpFree
	switch row.FpRule {
	case FPAtCFA:
		fpSlot, fpFree = cfa+uint64(int64(row.FpOffset)), true
	case FPAtFP:
		fpSlot, fpFree = g.framePointer()+uint64(int64(row.FpOffset)), true
	case FPAtSP:
		fpSlot, fpFree = g.sp+uint64(int64(row.FpOffset)), true
	case FPInvalid:
		g.fp, fpFree = 0, false
	}
	g.next(ra, cfa, false)
	g.fpSlot, g.fpFree = fpSlot, fpFree
	return true
}

// guessFrame lays out an interrupted frame of a file with a table, outside every function
// the table describes: the walker takes it for a leaf that pushed nothing, with its return
// address at sp, and keeps that caller only if a row describes it.
func (g *synth) guessFrame() bool {
	if !g.exact || g.guess != 0 {
		return false
	}
	ra, ok := g.words[g.sp]
	if !ok {
		ra = g.returnAddress()
		g.words[g.sp] = ra
	}
	g.guess = ra
	g.next(ra, g.sp+8, false)
	return true
}

// fpFrame lays out a frame walked by frame pointer, or, after morestack, by the return
// address at sp.
func (g *synth) fpFrame(sameStack bool) bool {
	if g.frameless {
		g.frameless = false
		ra := g.returnAddress()
		g.words[g.sp] = ra
		g.next(ra, g.sp+8, false)
		return true
	}
	fp := g.framePointer()
	if fp == 0 {
		return false
	}
	if !sameStack {
		// cgocallback's frame is on g0, wherever that is.
		if g.r.IntN(2) == 0 {
			fp = g.newStack()
			g.setFP(fp)
		}
	}
	ra := g.returnAddress()
	g.words[fp+8] = ra
	g.next(ra, fp+16, false)
	g.fpSlot, g.fpFree = fp, true
	return true
}

// goFrame lays out what a Go runtime switch reads.
func (g *synth) goFrame(kind unwind.GoFunc, rt *unwind.KernelGoRuntime) bool {
	if kind == unwind.GoFuncFPSwitch {
		return g.fpFrame(false)
	}
	if rt == nil || kind == unwind.GoFuncTop || int(kind) >= GoFuncCount {
		return false
	}
	if kind == unwind.GoFuncAsmcgocall {
		orig := g.newStack()
		if g.r.IntN(4) == 0 {
			g.words[g.sp+uint64(rt.CgoG)] = 0 // called on g0: no switch
			g.words[g.sp+uint64(rt.CgoDepth)] = orig
		} else {
			gor := synthHeap + 0x300_0000 + uint64(g.r.IntN(1<<16))*8
			hi := orig + 8*uint64(g.r.IntN(4096))
			g.words[g.sp+uint64(rt.CgoG)] = gor
			g.words[g.sp+uint64(rt.CgoDepth)] = hi - orig
			g.words[gor+uint64(rt.G_stackHi)] = hi
		}
		ra := g.returnAddress()
		g.words[orig] = ra
		fp, fpFree, fpSlot := g.fp, g.fpFree, g.fpSlot
		g.next(ra, orig+8, false)
		g.fp, g.fpFree, g.fpSlot = fp, fpFree, fpSlot
		return true
	}
	if !g.goObjects(rt) {
		return false
	}
	sched := g.curg + uint64(rt.G_sched)
	sp, ok := g.words[sched+uint64(rt.GobufSp)]
	if !ok {
		sp = g.newStack()
		g.words[sched+uint64(rt.GobufSp)] = sp
	}
	bpSlot := sched + uint64(rt.GobufBp)
	switch kind {
	case unwind.GoFuncSystemstack:
		ra := g.returnAddress()
		bp, bpSet := g.words[bpSlot]
		if bpSet && bp == sp || !bpSet && g.r.IntN(2) == 0 {
			// systemstack with a frame of its own: sched.bp is sched.sp, which holds the
			// caller's frame pointer, the return address above it.
			g.words[bpSlot] = sp
			g.words[sp+8] = ra
			g.next(ra, sp+16, false)
			if v, ok := g.words[sp]; ok {
				g.fp, g.fpFree = v, false
			} else {
				g.fpSlot, g.fpFree = sp, true
			}
			return true
		}
		g.words[sp] = ra
		g.next(ra, sp+8, false)
	case unwind.GoFuncMorestack:
		if _, ok := g.words[g.curg+uint64(rt.G_status)]; !ok {
			status := uint64(2) // _Grunning
			switch g.r.IntN(20) {
			case 0:
				status = 8 // _Gcopystack: the walk ends here
			case 1:
				status = 0x1008 // and scanned
			}
			g.words[g.curg+uint64(rt.G_status)] = status | g.r.Uint64()<<32
		}
		pc, ok := g.words[sched+uint64(rt.GobufPc)]
		if !ok {
			pc = g.codeAddr()
			g.words[sched+uint64(rt.GobufPc)] = pc
		}
		g.next(pc, sp, false)
		g.frameless = true
	default:
		return false
	}
	if v, ok := g.words[bpSlot]; ok {
		g.fp, g.fpFree = v, false
	} else {
		g.fpSlot, g.fpFree = bpSlot, true
	}
	return true
}

// memory turns the words written into regions, one per cluster of nearby words, the
// space between them filled with noise.
func (g *synth) memory() []memRegion {
	addrs := make([]uint64, 0, len(g.words))
	for a := range g.words {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	var regions []memRegion
	for i := 0; i < len(addrs); {
		j := i + 1
		for j < len(addrs) && addrs[j]-addrs[j-1] < 4096 {
			j++
		}
		lo, hi := addrs[i]-uint64(g.r.IntN(8))*8, addrs[j-1]+8+uint64(g.r.IntN(8))*8
		b := make([]byte, hi-lo)
		for k := 0; k+8 <= len(b); k += 8 {
			binary.LittleEndian.PutUint64(b[k:], g.r.Uint64())
		}
		for _, a := range addrs[i:j] {
			binary.LittleEndian.PutUint64(b[a-lo:], g.words[a])
		}
		regions = append(regions, memRegion{addr: lo, b: b})
		i = j
	}
	return regions
}

// damage breaks a share of the cases in one of the ways real stacks and tables break.
func (g *synth) damage(c *walkCase) {
	switch g.r.IntN(20) {
	case 0: // a word of the stack overwritten
		if len(c.mem) > 0 {
			m := c.mem[g.r.IntN(len(c.mem))]
			binary.LittleEndian.PutUint64(m.b[8*g.r.IntN(len(m.b)/8):], g.r.Uint64())
		}
	case 1: // a region unreadable, or cut short
		if len(c.mem) > 0 {
			i := g.r.IntN(len(c.mem))
			if g.r.IntN(2) == 0 {
				c.mem = slices.Delete(c.mem, i, i+1)
			} else {
				c.mem[i].b = c.mem[i].b[:g.r.IntN(len(c.mem[i].b)+1)]
			}
		}
	case 2: // a table gone from the kernel
		for id := range c.tables {
			delete(c.tables, id)
			break
		}
	case 3: // a mapping claiming more rows than its table has
		if len(c.maps) > 0 {
			c.maps[g.r.IntN(len(c.maps))].RowsCount += uint32(1 + g.r.IntN(100))
		}
	case 4: // no mappings known: frame pointers throughout
		c.noProc = true
	case 5: // a row's rule replaced
		for _, rows := range c.tables {
			if len(rows) > 0 {
				rows[g.r.IntN(len(rows))] = g.row(rows[g.r.IntN(len(rows))].Pc)
			}
			break
		}
	case 6: // the leaf outside any code
		c.thread.PC = g.r.Uint64()
	case 7: // a Go binary's layout missing
		for id := range c.goRT {
			delete(c.goRT, id)
			break
		}
	}
}
