package unwind

import (
	"math"
	"math/bits"
)

// DWARF expression operations the unwinder follows (DWARF 5, section 2.5).
const (
	opDeref      = 0x06
	opConst1u    = 0x08
	opConst1s    = 0x09
	opConst2u    = 0x0a
	opConst2s    = 0x0b
	opConst4u    = 0x0c
	opConst4s    = 0x0d
	opConst8u    = 0x0e
	opConst8s    = 0x0f
	opConstu     = 0x10
	opConsts     = 0x11
	opDup        = 0x12
	opDrop       = 0x13
	opOver       = 0x14
	opSwap       = 0x16
	opMinus      = 0x1c
	opMul        = 0x1e
	opPlus       = 0x22
	opPlusUconst = 0x23
	opShl        = 0x24
	opLit0       = 0x30
	opLit31      = 0x4f
	opBreg0      = 0x70
	opBreg31     = 0x8f
	opBregx      = 0x92
	opNop        = 0x96
)

// The expressions compilers and hand-written assembly put in x86-64 call frame
// information, found across the libraries and programs of a Debian 12 system (readelf
// --debug-dump=frames over /usr/lib/x86_64-linux-gnu, /usr/bin, /usr/libexec), by count
// of FDEs that use them:
//
//	CFA  *(rbp+N)                              4848  gcc's stack realignment (DRAP): mesa, x265, libitm
//	CFA  rsp+8+((rip&15)>=11)<<3               1783  ld's lazy PLT entries (CFAPLT)
//	CFA  *(rsp+N)+M                             141  OpenSSL's perlasm: libcrypto, node, libgcrypt
//	CFA  *(rbp+N)+M                               8  OpenSSL
//	CFA  *(rsp+N+r9*8)+M                          6  OpenSSL's bn_mul_mont and bn_mul4x_mont
//	CFA  *(rsp+N)                                 3
//	rbp  at rbp+N                              4848  DRAP's saved frame pointer
//	rbp  at rsp+N                                 4  glibc's sigreturn-style frames
//	rbx, r12-r15 at rbp+N, rsp+N, realigned CFA   *  registers the unwinder does not track
//
// All of the CFA and frame pointer forms above are followed (CFADeref, FPAtFP, FPAtSP);
// the i386 forms of the same (ebp, esp) belong to 32-bit files the unwinder does not
// read. Anything else ends the walk as CFAExpression, counted as such by the kernel.

// exprKind is the shape of a value an expression computes.
type exprKind uint8

const (
	exprConst exprKind = iota // off
	exprLin                   // base + index<<shift + off
	exprDeref                 // *(base + index<<shift + off) + post
)

// exprNone marks an unused register slot; exprCFA stands for the CFA that
// DW_CFA_expression pushes before the expression runs.
const (
	exprNone = -1
	exprCFA  = -2
)

// exprValue is a value on the stack of a symbolic evaluation: not a number, but how the
// number follows from registers and memory.
type exprValue struct {
	kind        exprKind
	base, index int // register numbers, exprCFA, or exprNone
	shift       uint8
	off, post   int64
}

// maxExprStack bounds the evaluation stack; the expressions above use two slots.
const maxExprStack = 16

// evalExpr evaluates a DWARF expression symbolically. cfa pushes the CFA first, as
// DW_CFA_expression and DW_CFA_val_expression do. ok is false for an operation outside
// what the unwinder follows, or a value it cannot represent.
func evalExpr(e []byte, cfa bool) (v exprValue, ok bool) {
	var stack []exprValue
	if cfa {
		stack = append(stack, exprValue{kind: exprLin, base: exprCFA, index: exprNone})
	}
	r := reader{b: e}
	pop := func() (exprValue, bool) {
		if len(stack) == 0 {
			return exprValue{}, false
		}
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		return v, true
	}
	push := func(v exprValue) bool {
		if len(stack) >= maxExprStack {
			return false
		}
		stack = append(stack, v)
		return true
	}
	konst := func(c int64) bool { return push(exprValue{kind: exprConst, base: exprNone, index: exprNone, off: c}) }
	for r.off < len(r.b) {
		op := r.u8()
		good := true
		switch {
		case op >= opLit0 && op <= opLit31:
			good = konst(int64(op - opLit0))
		case op >= opBreg0 && op <= opBreg31:
			good = push(exprValue{kind: exprLin, base: int(op - opBreg0), index: exprNone, off: r.sleb()})
		default:
			switch op {
			case opNop:
			case opConst1u:
				good = konst(int64(r.u8()))
			case opConst1s:
				good = konst(int64(int8(r.u8())))
			case opConst2u:
				good = konst(int64(r.u16()))
			case opConst2s:
				good = konst(int64(int16(r.u16())))
			case opConst4u:
				good = konst(int64(r.u32()))
			case opConst4s:
				good = konst(int64(int32(r.u32())))
			case opConst8u, opConst8s:
				good = konst(int64(r.u64()))
			case opConstu:
				good = konst(int64(r.uleb()))
			case opConsts:
				good = konst(r.sleb())
			case opBregx:
				reg := r.uleb()
				good = reg < 256 && push(exprValue{kind: exprLin, base: int(reg), index: exprNone, off: r.sleb()})
			case opDup, opOver:
				i := len(stack) - 1
				if op == opOver {
					i--
				}
				good = i >= 0 && push(stack[i])
			case opDrop:
				_, good = pop()
			case opSwap:
				good = len(stack) >= 2
				if good {
					n := len(stack)
					stack[n-1], stack[n-2] = stack[n-2], stack[n-1]
				}
			case opDeref:
				a, ok := pop()
				good = ok && a.kind == exprLin && push(exprValue{kind: exprDeref, base: a.base, index: a.index, shift: a.shift, off: a.off})
			case opPlusUconst:
				a, ok := pop()
				good = ok && push(a.add(int64(min(r.uleb(), math.MaxInt32))))
			case opPlus, opMinus, opMul, opShl:
				b, ok1 := pop()
				a, ok2 := pop()
				var c exprValue
				c, good = combine(op, a, b)
				good = good && ok1 && ok2 && push(c)
			default:
				good = false
			}
		}
		if !good || r.bad {
			return exprValue{}, false
		}
	}
	if len(stack) == 0 {
		return exprValue{}, false
	}
	v = stack[len(stack)-1]
	// Values past what any stack frame spans are corrupt input, not frames.
	if v.off < math.MinInt32 || v.off > math.MaxInt32 || v.post < math.MinInt32 || v.post > math.MaxInt32 {
		return exprValue{}, false
	}
	return v, true
}

// add adds a constant to a value: to its address, or after its dereference.
func (v exprValue) add(c int64) exprValue {
	if v.kind == exprDeref {
		v.post += c
	} else {
		v.off += c
	}
	return v
}

// combine combines two values where the result keeps a shape the unwinder follows.
func combine(op byte, a, b exprValue) (exprValue, bool) {
	switch op {
	case opPlus:
		switch {
		case b.kind == exprConst:
			return a.add(b.off), true
		case a.kind == exprConst:
			return b.add(a.off), true
		case a.kind == exprLin && b.kind == exprLin:
			return addLin(a, b)
		}
	case opMinus:
		if b.kind == exprConst {
			return a.add(-b.off), true
		}
	case opMul, opShl:
		if a.kind == exprConst && op == opMul {
			a, b = b, a
		}
		if b.kind != exprConst {
			return exprValue{}, false
		}
		shift := b.off
		if op == opMul {
			switch b.off {
			case 1, 2, 4, 8:
				shift = int64(bits.TrailingZeros64(uint64(b.off)))
			default:
				return exprValue{}, false
			}
		}
		switch {
		case shift < 0 || shift > 3:
		case a.kind == exprConst:
			return exprValue{kind: exprConst, base: exprNone, index: exprNone, off: a.off << shift}, true
		case a.kind == exprLin && a.index == exprNone && a.base >= 0:
			// A register scaled: the index of an address, as in rsp + r9*8.
			return exprValue{kind: exprLin, base: exprNone, index: a.base, shift: uint8(shift), off: a.off << shift}, true
		case a.kind == exprLin && a.base == exprNone && int64(a.shift)+shift <= 3:
			a.shift += uint8(shift)
			a.off <<= shift
			return a, true
		}
	}
	return exprValue{}, false
}

// addLin adds two register-relative values: at most one base register and one scaled
// index between them.
func addLin(a, b exprValue) (exprValue, bool) {
	type term struct {
		reg   int
		shift uint8
	}
	var terms []term
	for _, v := range []exprValue{a, b} {
		if v.base != exprNone {
			terms = append(terms, term{v.base, 0})
		}
		if v.index != exprNone {
			terms = append(terms, term{v.index, v.shift})
		}
	}
	out := exprValue{kind: exprLin, base: exprNone, index: exprNone, off: a.off + b.off}
	switch len(terms) {
	case 1:
		if terms[0].shift == 0 {
			out.base = terms[0].reg
		} else {
			out.index, out.shift = terms[0].reg, terms[0].shift
		}
		return out, true
	case 2:
		// The unscaled term is the base; of two unscaled ones, the stack or frame pointer.
		i := 0
		if terms[1].shift == 0 && (terms[0].shift != 0 || terms[1].reg == RegSP || terms[1].reg == RegFP) {
			i = 1
		}
		if terms[i].shift != 0 || terms[i].reg == exprCFA || terms[1-i].reg == exprCFA {
			return exprValue{}, false
		}
		out.base, out.index, out.shift = terms[i].reg, terms[1-i].reg, terms[1-i].shift
		return out, true
	}
	return exprValue{}, false
}

// setCFAExpr turns what a DW_CFA_def_cfa_expression computes into the state's CFA.
func (st *state) setCFAExpr(e []byte) {
	if isPLTExpr(e) {
		st.cfa = cfaPLT
		return
	}
	st.cfa = cfaOtherExpr
	v, ok := evalExpr(e, false)
	if !ok {
		return
	}
	if v.kind == exprLin && v.base == exprNone && v.shift == 0 {
		v.base, v.index = v.index, exprNone
	}
	if v.base < 0 || v.base >= 256 || v.index >= NumGPR {
		return
	}
	switch v.kind {
	case exprLin:
		if v.index == exprNone {
			st.cfa, st.exprReg, st.exprOff = cfaExprRegOff, uint8(v.base), v.off
		}
	case exprDeref:
		st.cfa, st.exprReg, st.exprOff, st.exprPost, st.exprIndex = cfaDeref, uint8(v.base), v.off, v.post, 0
		if v.index != exprNone {
			st.exprIndex = CFAIndex | v.shift<<4 | uint8(v.index)
		}
	}
}

// regExprRule turns a DW_CFA_expression for a register into a rule: where the register
// was saved.
func regExprRule(e []byte) rule {
	v, ok := evalExpr(e, true)
	if !ok || v.kind != exprLin || v.index != exprNone {
		return rule{kind: ruleExpr}
	}
	switch v.base {
	case exprCFA:
		return rule{ruleOffset, v.off}
	case RegFP:
		return rule{ruleAtFP, v.off}
	case RegSP:
		return rule{ruleAtSP, v.off}
	}
	return rule{kind: ruleExpr}
}
