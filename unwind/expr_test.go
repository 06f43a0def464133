package unwind

import (
	"math/rand/v2"
)

// dwarfMachine evaluates an expression the way a DWARF consumer does, on concrete
// registers and memory: the reference that evalExpr's symbolic reading, turned into a
// row and followed by Step, must agree with. ok is false where the expression is
// malformed or uses an operation the machine does not know.
func dwarfMachine(e []byte, regs *[NumGPR]uint64, mem func(uint64) uint64) (uint64, bool) {
	var stack []uint64
	r := reader{b: e}
	pop := func() uint64 {
		if len(stack) == 0 {
			r.bad = true
			return 0
		}
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		return v
	}
	for r.off < len(r.b) && !r.bad {
		op := r.u8()
		switch {
		case op >= opLit0 && op <= opLit31:
			stack = append(stack, uint64(op-opLit0))
		case op >= opBreg0 && op <= opBreg0+15:
			stack = append(stack, regs[op-opBreg0]+uint64(r.sleb()))
		default:
			switch op {
			case opConst1u:
				stack = append(stack, uint64(r.u8()))
			case opConst1s:
				stack = append(stack, uint64(int64(int8(r.u8()))))
			case opConstu:
				stack = append(stack, r.uleb())
			case opConsts:
				stack = append(stack, uint64(r.sleb()))
			case opDeref:
				stack = append(stack, mem(pop()))
			case opPlusUconst:
				stack = append(stack, pop()+r.uleb())
			case opPlus:
				b, a := pop(), pop()
				stack = append(stack, a+b)
			case opMinus:
				b, a := pop(), pop()
				stack = append(stack, a-b)
			case opMul:
				b, a := pop(), pop()
				stack = append(stack, a*b)
			case opShl:
				b, a := pop(), pop()
				stack = append(stack, a<<(b&63))
			case opDup:
				v := pop()
				stack = append(stack, v, v)
			case opDrop:
				pop()
			case opSwap:
				b, a := pop(), pop()
				stack = append(stack, b, a)
			case opOver:
				b, a := pop(), pop()
				stack = append(stack, a, b, a)
			default:
				return 0, false
			}
		}
	}
	if r.bad || len(stack) == 0 {
		return 0, false
	}
	return stack[len(stack)-1], true
}

// randomExpr writes an expression: mostly the shapes real CFI has, with random
// registers and constants, sometimes random sequences of operations.
func randomExpr(r *rand.Rand) []byte {
	w := &cfiWriter{}
	breg := func() { w.u8(opBreg0 + byte(r.IntN(NumGPR))); w.sleb(int64(r.IntN(512) - 128)) }
	lit := func() {
		switch r.IntN(4) {
		case 0:
			w.u8(opConst1u, byte(r.IntN(256)))
		case 1:
			w.u8(opConsts)
			w.sleb(int64(r.IntN(1024) - 512))
		default:
			w.u8(opLit0 + byte(r.IntN(9)))
		}
	}
	switch r.IntN(6) {
	case 0: // reg+N
		breg()
	case 1: // *(reg+N)(+M)
		breg()
		w.u8(opDeref)
		if r.IntN(2) == 0 {
			w.u8(opPlusUconst)
			w.uleb(uint64(r.IntN(64)))
		}
	case 2: // *(reg+N+reg*2^k)+M, in either order
		breg()
		breg()
		w.u8(opLit0 + []byte{1, 2, 4, 8}[r.IntN(4)])
		w.u8(opMul)
		if r.IntN(2) == 0 {
			w.u8(opSwap)
		}
		w.u8(opPlus, opDeref, opPlusUconst)
		w.uleb(uint64(r.IntN(64)))
	default: // anything
		for range 1 + r.IntN(6) {
			switch r.IntN(10) {
			case 0, 1, 2:
				breg()
			case 3, 4:
				lit()
			case 5:
				w.u8(opPlusUconst)
				w.uleb(uint64(r.IntN(100)))
			default:
				w.u8([]byte{opDeref, opPlus, opMinus, opMul, opShl, opDup, opDrop, opSwap, opOver, 0x1a, 0x27}[r.IntN(11)])
			}
		}
	}
	return w.b
}

// ExprRow is the row sonde makes of a CFA expression e, for the test beside the walker's
// model (expr_model_test.go) to evaluate; RandomExpr and DwarfMachine give it expressions
// and what they compute.
func ExprRow(e []byte) Row {
	c := &cie{raReg: regRA}
	st := state{ra: rule{ruleOffset, -8}}
	st.setCFAExpr(e)
	return c.row(&st)
}

var (
	RandomExpr   = randomExpr
	DwarfMachine = dwarfMachine
)
