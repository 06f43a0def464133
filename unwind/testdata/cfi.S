// Hand-written CFI for call frame instructions compilers rarely emit, so that the parser
// is checked against readelf on them too. None of this code is ever run.
#ifdef DEBUG_FRAME
	.cfi_sections .debug_frame
#endif
	.text

// Like glibc's __restore_rt: a signal frame ('S') whose FDE starts one byte before the
// symbol, so that a return address minus one still lands in it.
	.globl	cfi_signal
	.type	cfi_signal, @function
	.p2align 4
	.cfi_startproc simple
	.cfi_signal_frame
	.cfi_escape 0x0f, 0x04, 0x77, 0xa0, 0x01, 0x06	// def_cfa_expression: breg7 160; deref
	.cfi_escape 0x10, 0x06, 0x03, 0x77, 0xf8, 0x00	// expression rbp: breg7 120
	.cfi_escape 0x10, 0x10, 0x03, 0x77, 0xa8, 0x01	// expression rip: breg7 168
	nop
cfi_signal:
	movq	$15, %rax
	syscall
	.cfi_endproc
	.size	cfi_signal, .-cfi_signal

// ld's lazy PLT CFI, in its IBT form (DW_OP_lit10).
	.globl	cfi_plt
	.type	cfi_plt, @function
	.p2align 4
cfi_plt:
	.cfi_startproc
	.cfi_def_cfa_offset 16
	pushq	$0
	.cfi_def_cfa_offset 24
	jmp	*%rax
	.cfi_escape 0x0f, 0x0b, 0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3a, 0x2a, 0x33, 0x24, 0x22
	.rept 32
	nop
	.endr
	.cfi_endproc
	.size	cfi_plt, .-cfi_plt

// CFA expressions, each in an FDE of its own: readelf shows an expression CFA as "exp"
// without saying which of an FDE's expressions is in force at a row. A register and an
// offset, kept when the offset changes and left for the register rule with the last
// offset; a dereference, as OpenSSL writes them; and a form the unwinder does not follow.
	.globl	cfi_expr
	.type	cfi_expr, @function
cfi_expr:
	.cfi_startproc
	nop
	.cfi_escape 0x0f, 0x02, 0x77, 0x10	// def_cfa_expression: breg7 16
	nop
	.cfi_def_cfa_offset 24	// an expression CFA has no offset to change
	nop
	.cfi_def_cfa_register rsp	// back to a register rule, with the last offset
	nop
	.cfi_def_cfa rsp, 8
	ret
	.cfi_endproc
	.size	cfi_expr, .-cfi_expr

	.globl	cfi_expr_deref
	.type	cfi_expr_deref, @function
cfi_expr_deref:
	.cfi_startproc
	nop
	.cfi_escape 0x0f, 0x05, 0x77, 0x08, 0x06, 0x23, 0x08	// def_cfa_expression: breg7 8; deref; plus_uconst 8
	nop
	.cfi_escape 0x10, 0x06, 0x02, 0x77, 0x10	// expression rbp: breg7 16
	nop
	.cfi_def_cfa rsp, 8
	ret
	.cfi_endproc
	.size	cfi_expr_deref, .-cfi_expr_deref

	.globl	cfi_expr_other
	.type	cfi_expr_other, @function
cfi_expr_other:
	.cfi_startproc
	nop
	.cfi_escape 0x0f, 0x04, 0x77, 0x08, 0x3f, 0x1a	// def_cfa_expression: breg7 8; lit15; and
	nop
	.cfi_def_cfa rsp, 8
	ret
	.cfi_endproc
	.size	cfi_expr_other, .-cfi_expr_other

// The outermost frame, like _start.
	.globl	cfi_start
	.type	cfi_start, @function
cfi_start:
	.cfi_startproc
	.cfi_undefined rip
	xorl	%ebp, %ebp
	nop
	hlt
	.cfi_endproc
	.size	cfi_start, .-cfi_start

// A return address column other than rip gets a CIE of its own.
	.globl	cfi_racol
	.type	cfi_racol, @function
cfi_racol:
	.cfi_startproc
	.cfi_return_column rdx
	nop
	.cfi_def_cfa_offset 16
	ret
	.cfi_endproc
	.size	cfi_racol, .-cfi_racol

// One instruction of each remaining kind.
	.globl	cfi_misc
	.type	cfi_misc, @function
cfi_misc:
	.cfi_startproc
	pushq	%rbp
	.cfi_def_cfa_offset 16
	.cfi_offset rbp, -16
	movq	%rsp, %rbp
	.cfi_def_cfa_register rbp
	nop
	.cfi_remember_state
	.cfi_def_cfa rsp, 8
	.cfi_same_value rbp
	nop
	.cfi_remember_state
	.cfi_def_cfa_offset 32
	nop
	.cfi_restore_state
	nop
	.cfi_restore_state
	nop
	.cfi_escape 0x2e, 0x10	// GNU_args_size 16
	nop
	.cfi_escape 0x12, 0x07, 0x7e	// def_cfa_sf rsp, -2 (*-8 = 16)
	nop
	.cfi_escape 0x13, 0x7d	// def_cfa_offset_sf -3 (*-8 = 24)
	nop
	.cfi_escape 0x11, 0x06, 0x03	// offset_extended_sf rbp, 3 (*-8 = -24)
	nop
	.cfi_escape 0x05, 0x06, 0x04	// offset_extended rbp, 4 (*-8 = -32)
	nop
	.cfi_escape 0x2f, 0x06, 0x05	// GNU_negative_offset_extended rbp, 5 (-(5*-8) = +40)
	nop
	.cfi_restore rbp
	nop
	.cfi_offset rbp, -24
	nop
	.cfi_escape 0x06, 0x06	// restore_extended rbp
	nop
	.cfi_val_offset rbp, -16
	nop
	.cfi_register rbp, rbx
	nop
	.cfi_register rbp, rbp
	nop
	.cfi_escape 0x16, 0x06, 0x02, 0x77, 0x00	// val_expression rbp: breg7 0
	nop
	.cfi_escape 0x10, 0x06, 0x02, 0x76, 0x00	// expression rbp: breg6 0
	nop
	.cfi_same_value rbp
	nop
	.cfi_escape 0x15, 0x03, 0x02	// val_offset_sf rbx, 2: other registers do not matter
	.cfi_escape 0x10, 0x03, 0x02, 0x77, 0x00	// expression rbx
	.cfi_undefined rbx
	nop
	.cfi_def_cfa r12, 8
	nop
	.cfi_def_cfa rsp, 8
	.cfi_register rip, rdx
	nop
	.cfi_offset rip, -16
	nop
	.cfi_escape 0x16, 0x10, 0x02, 0x77, 0x00	// val_expression rip
	nop
	.cfi_offset rip, -8
	nop
	.cfi_undefined rip
	nop
	.cfi_restore rip
	nop
	.cfi_escape 0x0c, 0x07, 0x80, 0x80, 0x04	// def_cfa rsp, 65536
	nop
	.cfi_def_cfa rsp, 8
	.skip	70000, 0x90	// advance_loc4
	.cfi_def_cfa_offset 16
	.skip	300, 0x90	// advance_loc2
	.cfi_def_cfa_offset 8
	ret
	.cfi_endproc
	.size	cfi_misc, .-cfi_misc

	.section .note.GNU-stack,"",@progbits
