package ruby

import (
	"errors"
	"fmt"
)

// Version is a CRuby release.
type Version struct{ Major, Minor, Micro int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro) }

// ErrUnsupported: a CRuby of a version or build sonde cannot walk.
var ErrUnsupported = errors.New("unsupported ruby")

// Layout is where CRuby keeps what the walk and the names need, as byte offsets.
type Layout struct {
	// rb_execution_context_t: vm_stack, vm_stack_size (in VALUEs), cfp.
	ECVMStack, ECVMStackSize, ECCFP int
	// rb_control_frame_t: its size, pc, iseq, ep.
	CFPSize, CFPPC, CFPIseq, CFPEP int
	// rb_iseq_t: body. rb_iseq_constant_body: iseq_size, iseq_encoded, location (pathobj,
	// base_label, label, first_lineno in turn), insns_info (body, positions, size,
	// succ_index_table in turn).
	IseqBody, BodyIseqSize, BodyEncoded, BodyLocation, BodyInsnsInfo int
	// iseq_insn_info_entry: its size; line_no is its first field.
	InsnInfoEntrySize int
	// RString: where an embedded string's bytes start, and whether its length is in
	// the flags (3.1) rather than a len field (3.2 on); a heap string's len and ptr.
	StrEmbed      int
	StrLenInFlags bool
	StrLen        int
	StrPtr        int
	// RArray: an embedded array's first element, a heap array's ptr, and the mask of an
	// embedded array's length in its flags (shifted down).
	AryEmbed, AryPtr int
	AryEmbedLenMask  uint64
	// FlSingleton is the flag of a singleton class (FL_SINGLETON).
	FlSingleton uint64
	// Where a class's path and a singleton's object are: fields of the class's extension
	// (3.3 on: ClassPath, ClassAttached from the class), or instance variables in the
	// iv_tbl of the extension ClassExtPtr points to (3.1); 0: not read (3.2 keeps them
	// in shapes).
	ClassPath, ClassAttached int
	ClassExtPtr, ExtIvTbl    int
}

// layouts are CRuby's layouts per minor version of Ruby 3 on 64-bit Linux: facts of each
// version's vm_core.h, iseq.h and include/ruby/internal/core (offsetof as compiled for
// 3.1.2, 3.2.9, 3.3.8 and 3.4.7). What moved: the control frame lost its __bp__ slot in
// 3.3 (64 → 56 bytes), the constant body's param block shrank in 3.2, and strings took a
// len field in 3.2 (variable-width allocation), their bytes after it.
var layouts = map[int]Layout{
	1: withClasses(layout3(64, 120, false), 1),
	2: withClasses(layout3(64, 112, true), 2),
	3: withClasses(layout3(56, 112, true), 3),
	4: withClasses(layout3(56, 112, true), 4),
}

// MinMinor and MaxMinor bound the Ruby 3 releases the table holds.
const (
	MinMinor = 1
	MaxMinor = 4
)

func layout3(cfpSize, insnsInfo int, strLenField bool) Layout {
	l := Layout{
		ECVMStack: 0, ECVMStackSize: 8, ECCFP: 16,
		CFPSize: cfpSize, CFPPC: 0, CFPIseq: 16, CFPEP: 32,
		IseqBody: 16, BodyIseqSize: 4, BodyEncoded: 8, BodyLocation: 64, BodyInsnsInfo: insnsInfo,
		InsnInfoEntrySize: 12,
		StrEmbed:          16, StrLenInFlags: true, StrLen: 16, StrPtr: 24,
		AryEmbed: 16, AryPtr: 32,
	}
	if strLenField {
		l.StrEmbed, l.StrLenInFlags = 24, false
	}
	return l
}

// withClasses adds where classes keep their names. 3.1's RClass points to its extension
// (without variable-width allocation), whose iv_tbl is its second field; 3.3's is the
// 32-byte RClass followed by its extension, whose attached object and classpath are at
// 96 and 120. FL_SINGLETON moved from FL_USER0 to FL_USER1 in 3.4; the embedded array's
// length took FL_USER3 to FL_USER9 with variable-width allocation (3.2), two bits before.
func withClasses(l Layout, minor int) Layout {
	l.FlSingleton, l.AryEmbedLenMask = 1<<12, 0x7f
	switch minor {
	case 1:
		l.ClassExtPtr, l.ExtIvTbl, l.AryEmbedLenMask = 24, 8, 0x3
	case 3, 4:
		l.ClassAttached, l.ClassPath = 32+96, 32+120
	}
	if minor >= 4 {
		l.FlSingleton = 1 << 13
	}
	return l
}

func tableLayout(v Version) (Layout, error) {
	l, ok := layouts[v.Minor]
	if v.Major != 3 || !ok {
		return Layout{}, fmt.Errorf("ruby %s: %w (sonde knows 3.%d to 3.%d)", v, ErrUnsupported, MinMinor, MaxMinor)
	}
	return l, nil
}
