package unwind

import (
	"errors"
	"iter"
	"math"
)

// x86-64 DWARF register numbers.
const (
	RegFP = 6  // rbp
	RegSP = 7  // rsp
	regRA = 16 // the return address column (rip)
)

// Call frame instructions.
const (
	cfaAdvanceLoc = 0x40 // high two bits; delta in the low six
	cfaOffset     = 0x80 // high two bits; register in the low six
	cfaRestore    = 0xc0 // high two bits; register in the low six

	cfaNop                       = 0x00
	cfaSetLoc                    = 0x01
	cfaAdvanceLoc1               = 0x02
	cfaAdvanceLoc2               = 0x03
	cfaAdvanceLoc4               = 0x04
	cfaOffsetExtended            = 0x05
	cfaRestoreExtended           = 0x06
	cfaUndefined                 = 0x07
	cfaSameValue                 = 0x08
	cfaRegister                  = 0x09
	cfaRememberState             = 0x0a
	cfaRestoreState              = 0x0b
	cfaDefCFA                    = 0x0c
	cfaDefCFARegister            = 0x0d
	cfaDefCFAOffset              = 0x0e
	cfaDefCFAExpression          = 0x0f
	cfaExpression                = 0x10
	cfaOffsetExtendedSF          = 0x11
	cfaDefCFASF                  = 0x12
	cfaDefCFAOffsetSF            = 0x13
	cfaValOffset                 = 0x14
	cfaValOffsetSF               = 0x15
	cfaValExpression             = 0x16
	cfaGNUArgsSize               = 0x2e
	cfaGNUNegativeOffsetExtended = 0x2f
)

// ruleKind is how a register of the caller is recovered.
type ruleKind uint8

const (
	// ruleUnset: not mentioned by the program. The x86-64 ABI makes rbp callee-saved, so
	// it means the same as ruleSame for the frame pointer.
	ruleUnset ruleKind = iota
	ruleUndefined
	ruleSame
	ruleOffset    // saved at CFA + off
	ruleValOffset // value is CFA + off
	ruleRegister  // held in register off
	ruleAtFP      // saved at the frame's rbp + off (an expression)
	ruleAtSP      // saved at the frame's rsp + off (an expression)
	ruleExpr      // saved where an expression of another form says
	ruleValExpr
)

type rule struct {
	kind ruleKind
	off  int64
}

type cfaKind uint8

const (
	cfaUnset cfaKind = iota
	cfaRegOff
	cfaPLT
	cfaExprRegOff // an expression computing exprReg + exprOff
	cfaDeref      // an expression computing *(exprReg + exprOff [+ index]) + exprPost
	cfaOtherExpr
)

// state is the part of a CFA program's row that the unwinder uses: only the frame
// pointer and return address columns are tracked, so rows stay small and rules for
// other registers cost nothing. An expression's terms are kept apart from the register
// and offset, because, as in libgcc and readelf, DW_CFA_def_cfa_offset after an
// expression leaves the expression in force, and DW_CFA_def_cfa_register then returns to
// the offset set before it.
type state struct {
	cfa       cfaKind
	cfaReg    uint64
	cfaOff    int64
	exprReg   uint8
	exprOff   int64
	exprPost  int64
	exprIndex uint8 // cfaDeref: CFAIndex | shift<<4 | register, or 0
	fp, ra    rule
}

// pltExpr is the CFA expression GNU ld emits for lazy .plt entries (bfd/elf64-x86-64.c):
// DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_lit11; DW_OP_ge;
// DW_OP_lit3; DW_OP_shl; DW_OP_plus. The IBT PLT variant has DW_OP_lit10 at pltLitIndex.
var pltExpr = [...]byte{0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22}

const pltLitIndex = 6

func isPLTExpr(e []byte) bool {
	if len(e) != len(pltExpr) {
		return false
	}
	for i, b := range e {
		if b != pltExpr[i] && !(i == pltLitIndex && b == 0x3a) {
			return false
		}
	}
	return true
}

// maxStateStack bounds DW_CFA_remember_state nesting; compilers nest one or two deep.
const maxStateStack = 64

var (
	errBadCFI       = errors.New("malformed call frame instructions")
	errUnsupported  = errors.New("unsupported call frame instruction")
	errStateStack   = errors.New("unbalanced remember_state/restore_state")
	errLocBackwards = errors.New("location moves backwards")
)

// factor multiplies an unsigned operand by a signed alignment factor. Results that cannot
// be a real offset saturate, which the int32 range check of a row then rejects.
func factor(v uint64, f int64) int64 {
	if v > math.MaxInt32 || f > math.MaxInt32 || f < math.MinInt32 {
		return math.MaxInt64
	}
	return int64(v) * f
}

func factorS(v int64, f int64) int64 {
	if v > math.MaxInt32 || v < math.MinInt32 || f > math.MaxInt32 || f < math.MinInt32 {
		return math.MaxInt64
	}
	return v * f
}

// row turns a state into the rule the kernel unwinder follows.
func (c *cie) row(st *state) Row {
	if c.raReg != regRA {
		return Row{}
	}
	switch {
	case st.ra.kind == ruleUndefined:
		return Row{CFA: CFAEndOfStack}
	case st.ra.kind != ruleOffset || st.ra.off != -8:
		// The unwinder hardwires the return address at CFA-8, which is all a call
		// instruction produces; anything else (longjmp's register rules) it cannot follow.
		return Row{CFA: CFARAElsewhere}
	}
	var r Row
	switch st.cfa {
	case cfaRegOff, cfaExprRegOff:
		reg, off := st.cfaReg, st.cfaOff
		if st.cfa == cfaExprRegOff {
			reg, off = uint64(st.exprReg), st.exprOff
		}
		if off < math.MinInt32 || off > math.MaxInt32 || reg > math.MaxUint8 {
			return Row{}
		}
		switch reg {
		case RegSP:
			r.CFA = CFASP
		case RegFP:
			r.CFA = CFAFP
		default:
			// Another register: the kernel knows it only in the frame it interrupted.
			r.CFA, r.CFAReg = CFAReg, uint8(reg)
		}
		r.CFAOffset = int32(off)
	case cfaPLT:
		r.CFA = CFAPLT
	case cfaDeref:
		// evalExpr keeps offsets within int32.
		r.CFA, r.CFAReg, r.CFAOffset, r.CFAIndex, r.CFAPost = CFADeref, st.exprReg, int32(st.exprOff), st.exprIndex, int32(st.exprPost)
	case cfaOtherExpr:
		return Row{CFA: CFAExpression}
	default:
		return Row{}
	}
	switch st.fp.kind {
	case ruleUnset, ruleSame:
		r.FP = FPUnchanged
	case ruleOffset, ruleAtFP, ruleAtSP:
		if st.fp.off < math.MinInt32 || st.fp.off > math.MaxInt32 {
			r.FP = FPInvalid
			break
		}
		r.FP = map[ruleKind]FPRule{ruleOffset: FPAtCFA, ruleAtFP: FPAtFP, ruleAtSP: FPAtSP}[st.fp.kind]
		r.FPOffset = int32(st.fp.off)
	case ruleRegister:
		if st.fp.off == RegFP {
			r.FP = FPUnchanged
		} else {
			r.FP = FPInvalid
		}
	default:
		// Undefined, value rules and other expressions: the caller's rbp is not in memory
		// where the kernel can find it.
		r.FP = FPInvalid
	}
	return r
}

// builder accumulates the rows of all FDEs in address order.
type builder struct {
	*rowSink
	stack []state // remember_state stack, reused across FDEs
	sec   *frameSection

	// lo and hi bound the rows the current FDE may emit: hi is its end and lo its start,
	// raised past the FDEs already emitted when it overlaps them.
	lo, hi uint64
	// gap is the rule between FDEs: none, or, in a Go binary, the frame pointer.
	gap Row
}

// rowSink gathers a table's rows as they are made. Without out it keeps them all in
// rows. With out, rows is a fixed buffer: once full, out takes the rows made final and the
// buffer starts again, so a large file's table is never whole in memory.
type rowSink struct {
	rows []Row
	out  func([]Row)
	// sent is how many rows at the start of rows out has taken already: the last of
	// them stays for the next row to merge with.
	sent int
}

// emit appends a row starting at pc, merging it into the previous row when the rules
// are equal. Callers emit in nondecreasing pc order.
func (s *rowSink) emit(pc uint64, r Row) {
	r.PC = pc
	r = r.normal()
	n := len(s.rows)
	if n > s.sent && s.rows[n-1].PC == pc {
		// The later rule for the same address wins. A row out has taken lies at a lower
		// address than any emitted since: it is never replaced.
		s.rows = s.rows[:n-1]
		n--
	}
	if n > 0 && sameRule(s.rows[n-1], r) {
		return
	}
	if s.out != nil && n == cap(s.rows) {
		// r lies past the last row, which no later row can replace now.
		s.out(s.rows[s.sent:])
		s.rows[0] = s.rows[n-1]
		s.rows, s.sent = s.rows[:1], 1
	}
	s.rows = append(s.rows, r)
}

// finish hands out the rows it still holds.
func (s *rowSink) finish() {
	if s.out == nil {
		return
	}
	if len(s.rows) > s.sent {
		s.out(s.rows[s.sent:])
	}
	s.rows, s.sent = s.rows[:0], 0
}

// run emits the rows of fdes, sorted by start address, with the gap rule from address 0
// and between FDEs, and hands out the last of them.
func (b *builder) run(fdes iter.Seq[*fde]) {
	if b.gap.CFA != CFAInvalid {
		b.emit(0, b.gap)
	}
	b.build(fdes)
	b.finish()
}

// normal clears the fields a row's rules do not use, so that equal rules compare equal.
func (r Row) normal() Row {
	switch r.CFA {
	case CFASP, CFAFP:
		r.CFAReg, r.CFAIndex, r.CFAPost = 0, 0, 0
	case CFAReg:
		r.CFAIndex, r.CFAPost = 0, 0
	case CFADeref:
	case CFAGo:
		r.CFAOffset, r.CFAIndex, r.CFAPost = 0, 0, 0
		r.FP = FPUnchanged
	default:
		r.CFAOffset, r.CFAReg, r.CFAIndex, r.CFAPost = 0, 0, 0, 0
		r.FP = FPUnchanged
	}
	switch r.FP {
	case FPAtCFA, FPAtFP, FPAtSP:
	default:
		r.FPOffset = 0
	}
	return r
}

func sameRule(a, b Row) bool {
	return a.CFA == b.CFA && a.FP == b.FP && a.CFAOffset == b.CFAOffset && a.FPOffset == b.FPOffset &&
		a.CFAReg == b.CFAReg && a.CFAIndex == b.CFAIndex && a.CFAPost == b.CFAPost
}

// segment emits r for [loc, next), clipped to the current FDE's bounds.
func (b *builder) segment(loc, next uint64, r Row) {
	next = min(next, b.hi)
	loc = max(loc, b.lo)
	if loc < next {
		b.emit(loc, r)
	}
}

// build emits the rows of fdes, which must be sorted by start address. Where FDEs
// overlap, the one starting first keeps its whole range and later ones are clipped, so
// the result depends only on the input order.
func (b *builder) build(fdes iter.Seq[*fde]) {
	var covered uint64
	started := false
	for f := range fdes {
		if f.end <= f.start || (started && f.end <= covered) {
			continue
		}
		if started && f.start > covered {
			// A gap: the previous FDE's range ends here.
			b.emit(covered, b.gap)
		}
		b.lo, b.hi = f.start, f.end
		if started {
			b.lo = max(b.lo, covered)
		}
		b.fde(f)
		covered, started = f.end, true
	}
	if started {
		b.emit(covered, b.gap)
	}
}

// fde emits the rows of one FDE.
func (b *builder) fde(f *fde) {
	c := f.cie
	if c.signal {
		// The trampoline's CFI describes the ucontext with expressions; the unwinder reads
		// the ucontext directly, wherever in the trampoline the PC is.
		b.segment(f.start, f.end, Row{CFA: CFASignal})
		return
	}
	if !b.initCIE(c) {
		b.segment(f.start, f.end, Row{})
		return
	}
	st := c.init
	ins, insAddr := f.ins(b.sec)
	loc, err := b.exec(c, ins, insAddr, &st, f.start, true)
	if err != nil {
		// Rows before the bad instruction stand; the rest of the range has no rule.
		b.segment(loc, f.end, Row{})
		return
	}
	b.segment(loc, f.end, c.row(&st))
}

// initCIE runs a CIE's initial instructions once.
func (b *builder) initCIE(c *cie) bool {
	if c.initDone {
		return c.initOK
	}
	var st state
	_, err := b.exec(c, c.ins, c.insAddr, &st, 0, false)
	c.init, c.initOK, c.initDone = st, err == nil, true
	return c.initOK
}

// exec runs a CFA program from loc. For an FDE (fdeMode) it emits the row in force before
// each advance and returns the final location; a CIE's initial instructions have no
// location, so advances there are ignored, as libgcc does.
func (b *builder) exec(c *cie, ins []byte, insAddr uint64, st *state, loc uint64, fdeMode bool) (uint64, error) {
	r := reader{b: ins}
	b.stack = b.stack[:0]
	fnStart := loc

	set := func(reg uint64, ru rule) {
		switch reg {
		case RegFP:
			st.fp = ru
		case c.raReg:
			st.ra = ru
		}
	}
	restore := func(reg uint64) {
		if !fdeMode {
			set(reg, rule{})
			return
		}
		switch reg {
		case RegFP:
			st.fp = c.init.fp
		case c.raReg:
			st.ra = c.init.ra
		}
	}
	advance := func(d uint64) error {
		next := loc + d
		if next < loc {
			return errBadCFI
		}
		if fdeMode && d > 0 {
			b.segment(loc, next, c.row(st))
		}
		loc = next
		return nil
	}
	block := func() []byte {
		n := r.uleb()
		if r.bad || n > uint64(len(r.b)-r.off) {
			r.bad = true
			return nil
		}
		e := r.b[r.off : r.off+int(n)]
		r.off += int(n)
		return e
	}

	for r.off < len(r.b) {
		if fdeMode && loc >= b.hi {
			// Later rows lie beyond the FDE's range.
			return loc, nil
		}
		op := r.u8()
		var err error
		switch op & 0xc0 {
		case cfaAdvanceLoc:
			err = advance(mulAlign(uint64(op&0x3f), c.codeAlign))
		case cfaOffset:
			set(uint64(op&0x3f), rule{ruleOffset, factor(r.uleb(), c.dataAlign)})
		case cfaRestore:
			restore(uint64(op & 0x3f))
		default:
			switch op {
			case cfaNop:
			case cfaGNUArgsSize:
				r.uleb() // only exception handling adjusts for outgoing arguments
			case cfaSetLoc:
				var to uint64
				if b.sec.debug && !c.augData {
					to = r.uint(int(c.addrSize))
				} else {
					var ind bool
					to, ind = r.ptr(c.fdeEnc, int(c.addrSize), insAddr, b.sec.bases, fnStart)
					if ind {
						err = errUnsupported
						break
					}
				}
				if r.bad {
					break
				}
				if to < loc {
					err = errLocBackwards
					break
				}
				err = advance(to - loc)
			case cfaAdvanceLoc1:
				err = advance(mulAlign(uint64(r.u8()), c.codeAlign))
			case cfaAdvanceLoc2:
				err = advance(mulAlign(uint64(r.u16()), c.codeAlign))
			case cfaAdvanceLoc4:
				err = advance(mulAlign(uint64(r.u32()), c.codeAlign))
			case cfaOffsetExtended:
				reg := r.uleb()
				set(reg, rule{ruleOffset, factor(r.uleb(), c.dataAlign)})
			case cfaOffsetExtendedSF:
				reg := r.uleb()
				set(reg, rule{ruleOffset, factorS(r.sleb(), c.dataAlign)})
			case cfaGNUNegativeOffsetExtended:
				reg := r.uleb()
				set(reg, rule{ruleOffset, -factor(r.uleb(), c.dataAlign)})
			case cfaValOffset:
				reg := r.uleb()
				set(reg, rule{ruleValOffset, factor(r.uleb(), c.dataAlign)})
			case cfaValOffsetSF:
				reg := r.uleb()
				set(reg, rule{ruleValOffset, factorS(r.sleb(), c.dataAlign)})
			case cfaRestoreExtended:
				restore(r.uleb())
			case cfaUndefined:
				set(r.uleb(), rule{kind: ruleUndefined})
			case cfaSameValue:
				set(r.uleb(), rule{kind: ruleSame})
			case cfaRegister:
				reg := r.uleb()
				other := r.uleb()
				set(reg, rule{ruleRegister, int64(min(other, math.MaxInt32))})
			case cfaExpression:
				reg := r.uleb()
				set(reg, regExprRule(block()))
			case cfaValExpression:
				reg := r.uleb()
				block()
				set(reg, rule{kind: ruleValExpr})
			case cfaRememberState:
				if len(b.stack) >= maxStateStack {
					err = errStateStack
					break
				}
				b.stack = append(b.stack, *st)
			case cfaRestoreState:
				n := len(b.stack)
				if n == 0 {
					err = errStateStack
					break
				}
				// Like libgcc and readelf, the saved state includes the CFA rule; gcc
				// relies on that after epilogues.
				*st = b.stack[n-1]
				b.stack = b.stack[:n-1]
			case cfaDefCFA:
				st.cfa = cfaRegOff
				st.cfaReg = r.uleb()
				st.cfaOff = int64(min(r.uleb(), math.MaxInt64))
			case cfaDefCFASF:
				st.cfa = cfaRegOff
				st.cfaReg = r.uleb()
				st.cfaOff = factorS(r.sleb(), c.dataAlign)
			case cfaDefCFARegister:
				// An expression CFA turns into register+offset with whatever offset was last set.
				st.cfa = cfaRegOff
				st.cfaReg = r.uleb()
			case cfaDefCFAOffset:
				// Meaningless after an expression CFA; the expression stays, as in libgcc.
				st.cfaOff = int64(min(r.uleb(), math.MaxInt64))
			case cfaDefCFAOffsetSF:
				st.cfaOff = factorS(r.sleb(), c.dataAlign)
			case cfaDefCFAExpression:
				st.setCFAExpr(block())
			default:
				err = errUnsupported
			}
		}
		if err == nil && r.bad {
			err = errBadCFI
		}
		if err != nil {
			return loc, err
		}
	}
	return loc, nil
}

// mulAlign scales a location delta by the code alignment factor, saturating so that the
// overflow check in advance rejects absurd values.
func mulAlign(d, f uint64) uint64 {
	if f != 0 && d > math.MaxUint64/f {
		return math.MaxUint64
	}
	return d * f
}
