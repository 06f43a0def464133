package interp

import (
	"bytes"
	"debug/elf"

	"golang.org/x/arch/x86/x86asm"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/unwind"
)

// maxEvalRead bounds the bytes of an interpreter loop's head decoded to find its other
// part: Debian's CPython heads are one to three kilobytes, a whole eval loop some tens (43
// in pyenv's 3.11), PHP's execute_ex 37 to 43.
const maxEvalRead = 1 << 20

// OutOfLinePart finds the part of an interpreter's loop (the function at [start, end)) the
// compiler moved out of line (gcc's function partitioning: _PyEval_EvalFrameDefault.cold,
// execute_ex.cold) in a file whose .symtab is gone, as distributions strip their
// interpreters. Debian's CPython builds keep only a head of one to three kilobytes under
// the exported symbol and run their opcodes in the other part, so without it no activation
// of the eval loop is seen on the stack; PHP's keeps its cold handlers there. table is the
// file's unwind table, built only if a candidate is found (nil: none could be).
//
// Only what a stripped file keeps is used: the head's code and .eh_frame, where each part
// of a split function has its own FDE. The head branches into its other part, and that
// part's FDE starts inside a frame (its first row's CFA is not a function entry's), where
// a function the head tail-calls starts at its entry. The eligible FDE most branches land
// in is the part; none means the function was not split. x86-64 only: the kernel walks
// Python frames only where it unwinds by tables.
func OutOfLinePart(f *elf.File, start, end uint64, table func() *unwind.Table) [2]uint64 {
	if f.Machine != elf.EM_X86_64 || end <= start || end-start > maxEvalRead {
		return [2]uint64{}
	}
	code, err := objfile.ReadVaddr(f, start, end-start)
	if err != nil || len(code) == 0 {
		return [2]uint64{}
	}
	targets := branchTargetsX86(code, start)
	ranges, err := unwind.FunctionRanges(f)
	if err != nil || len(ranges) == 0 {
		return [2]uint64{}
	}
	hits := map[unwind.CodeRange]int{}
	for _, to := range targets {
		if to >= start && to < end {
			continue
		}
		if r, found := unwind.RangeAt(ranges, to); found {
			hits[r]++
		}
	}
	if len(hits) == 0 {
		return [2]uint64{}
	}
	t := table()
	if t == nil {
		return [2]uint64{}
	}
	var best unwind.CodeRange
	for r, n := range hits {
		if t.AtEntry(r.Start) {
			continue
		}
		if n > hits[best] || n == hits[best] && r.Start < best.Start {
			best = r
		}
	}
	if hits[best] == 0 {
		return [2]uint64{}
	}
	return [2]uint64{best.Start, best.End}
}

// branchTargetsX86 decodes x86-64 code from its start and returns where its direct jumps
// go. Decoding stops at the first byte sequence that is not an instruction: compilers
// keep no data in a function's code.
func branchTargetsX86(code []byte, addr uint64) []uint64 {
	var out []uint64
	DecodeX86(code, addr, func(inst x86asm.Inst, next uint64) bool {
		if inst.Op != x86asm.CALL && isJump(inst.Op) {
			if rel, ok := inst.Args[0].(x86asm.Rel); ok {
				out = append(out, next+uint64(int64(rel)))
			}
		}
		return true
	})
	return out
}

var endbr64 = []byte{0xf3, 0x0f, 0x1e, 0xfa}

// DecodeX86 decodes x86-64 code at addr from its start, until the first byte sequence that
// is not an instruction, passing over CET's landing pads (endbr64), which the decoder does
// not know; fn hears each instruction and the address after it, and stops the decoding by
// returning false.
func DecodeX86(code []byte, addr uint64, fn func(inst x86asm.Inst, next uint64) bool) {
	for off := 0; off < len(code); {
		if bytes.HasPrefix(code[off:], endbr64) {
			off += len(endbr64)
			continue
		}
		inst, err := x86asm.Decode(code[off:], 64)
		if err != nil || inst.Len == 0 {
			return
		}
		off += inst.Len
		if !fn(inst, addr+uint64(off)) {
			return
		}
	}
}

func isJump(op x86asm.Op) bool {
	switch op {
	case x86asm.JMP, x86asm.JA, x86asm.JAE, x86asm.JB, x86asm.JBE, x86asm.JE, x86asm.JNE, x86asm.JG,
		x86asm.JGE, x86asm.JL, x86asm.JLE, x86asm.JO, x86asm.JNO, x86asm.JP, x86asm.JNP, x86asm.JS, x86asm.JNS:
		return true
	}
	return false
}
