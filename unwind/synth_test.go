package unwind

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Synthetic files cover encodings and formats that the toolchain at hand does not emit:
// 64-bit DWARF, CIE versions 3 and 4, code alignment factors other than 1, set_loc, the
// rarer pointer encodings, overlapping FDEs and malformed programs.

// cfiWriter assembles call frame information.
type cfiWriter struct {
	b     []byte
	addr  uint64 // address of the section
	debug bool   // .debug_frame conventions
}

func (w *cfiWriter) u8(v ...byte) { w.b = append(w.b, v...) }
func (w *cfiWriter) u16(v uint16) { w.b = binary.LittleEndian.AppendUint16(w.b, v) }
func (w *cfiWriter) u32(v uint32) { w.b = binary.LittleEndian.AppendUint32(w.b, v) }
func (w *cfiWriter) u64(v uint64) { w.b = binary.LittleEndian.AppendUint64(w.b, v) }
func (w *cfiWriter) uleb(v uint64) {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			c |= 0x80
		}
		w.b = append(w.b, c)
		if v == 0 {
			return
		}
	}
}
func (w *cfiWriter) sleb(v int64) {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		done := (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0)
		if !done {
			c |= 0x80
		}
		w.b = append(w.b, c)
		if done {
			return
		}
	}
}

// here is the address of the next byte.
func (w *cfiWriter) here() uint64 { return w.addr + uint64(len(w.b)) }

// entry writes a length-prefixed CIE or FDE. id writes the id field, given its offset;
// body writes the rest. Entries are padded to 8 bytes with DW_CFA_nop, as assemblers do.
func (w *cfiWriter) entry(dwarf64 bool, id func(idOff int), body func()) int {
	start := len(w.b)
	if dwarf64 {
		w.u32(0xffffffff)
		w.u64(0)
	} else {
		w.u32(0)
	}
	lenEnd := len(w.b)
	id(lenEnd)
	body()
	for (len(w.b)-start)%8 != 0 {
		w.u8(cfaNop)
	}
	n := len(w.b) - lenEnd
	if dwarf64 {
		binary.LittleEndian.PutUint64(w.b[start+4:], uint64(n))
	} else {
		binary.LittleEndian.PutUint32(w.b[start:], uint32(n))
	}
	return start
}

// cie writes a CIE. augData writes the 'z' augmentation data, if aug starts with 'z'.
func (w *cfiWriter) cie(dwarf64 bool, version byte, aug string, codeAlign uint64, dataAlign int64, ra uint64, augData func(), ins ...byte) int {
	return w.entry(dwarf64, func(int) {
		switch {
		case !w.debug:
			w.u32(0)
		case dwarf64:
			w.u64(^uint64(0))
		default:
			w.u32(0xffffffff)
		}
	}, func() {
		w.u8(version)
		w.u8([]byte(aug)...)
		w.u8(0)
		if strings.HasPrefix(aug, "eh") {
			w.u64(0)
		}
		if version == 4 {
			w.u8(8, 0) // address size, segment selector size
		}
		w.uleb(codeAlign)
		w.sleb(dataAlign)
		if version == 1 {
			w.u8(byte(ra))
		} else {
			w.uleb(ra)
		}
		if strings.HasPrefix(aug, "z") {
			w.u8(0) // length, patched below; the tests keep it under 128
			lenAt := len(w.b) - 1
			if augData != nil {
				augData()
			}
			w.b[lenAt] = byte(len(w.b) - lenAt - 1)
		}
		w.u8(ins...)
	})
}

// fde writes an FDE for cieOff. addrs writes pc_begin and the range; aug, when not nil,
// is the augmentation data that CIEs with 'z' require.
func (w *cfiWriter) fde(dwarf64 bool, cieOff int, addrs func(), aug []byte, ins ...byte) int {
	return w.entry(dwarf64, func(idOff int) {
		var v uint64
		if w.debug {
			v = uint64(cieOff)
		} else {
			v = uint64(idOff - cieOff)
		}
		if dwarf64 {
			w.u64(v)
		} else {
			w.u32(uint32(v))
		}
	}, func() {
		addrs()
		if aug != nil {
			w.uleb(uint64(len(aug)))
			w.u8(aug...)
		}
		w.u8(ins...)
	})
}

// noAug is the empty augmentation data of an FDE whose CIE has 'z'.
var noAug = []byte{}

// pcrel4 writes target as a DW_EH_PE_pcrel|sdata4 value.
func (w *cfiWriter) pcrel4(target uint64) { w.u32(uint32(target - w.here())) }

// synSec is a section of a synthetic ELF file.
type synSec struct {
	name  string
	typ   elf.SectionType
	flags elf.SectionFlag
	addr  uint64
	data  []byte
}

// synELF lays out a minimal x86-64 ELF file with the given sections.
func synELF(typ elf.Type, secs ...synSec) []byte {
	var shstr []byte
	shstr = append(shstr, 0)
	names := make([]int, len(secs))
	for i, s := range secs {
		names[i] = len(shstr)
		shstr = append(shstr, s.name...)
		shstr = append(shstr, 0)
	}
	names = append(names, len(shstr))
	shstr = append(shstr, ".shstrtab\x00"...)
	secs = append(secs, synSec{name: ".shstrtab", typ: elf.SHT_STRTAB, data: shstr})

	out := make([]byte, 64)
	offs := make([]int, len(secs))
	for i, s := range secs {
		for len(out)%8 != 0 {
			out = append(out, 0)
		}
		offs[i] = len(out)
		if s.typ != elf.SHT_NOBITS {
			out = append(out, s.data...)
		}
	}
	for len(out)%8 != 0 {
		out = append(out, 0)
	}
	shoff := len(out)
	le := binary.LittleEndian
	out = append(out, make([]byte, 64)...) // null section
	for i, s := range secs {
		var sh [64]byte
		le.PutUint32(sh[0:], uint32(names[i]))
		le.PutUint32(sh[4:], uint32(s.typ))
		le.PutUint64(sh[8:], uint64(s.flags))
		le.PutUint64(sh[16:], s.addr)
		le.PutUint64(sh[24:], uint64(offs[i]))
		le.PutUint64(sh[32:], uint64(len(s.data)))
		le.PutUint64(sh[48:], 1)
		out = append(out, sh[:]...)
	}
	h := out[:64]
	copy(h, "\x7fELF")
	h[4], h[5], h[6] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	le.PutUint16(h[16:], uint16(typ))
	le.PutUint16(h[18:], uint16(elf.EM_X86_64))
	le.PutUint32(h[20:], uint32(elf.EV_CURRENT))
	le.PutUint64(h[40:], uint64(shoff))
	le.PutUint16(h[52:], 64)
	le.PutUint16(h[58:], 64)
	le.PutUint16(h[60:], uint16(len(secs)+1))
	le.PutUint16(h[62:], uint16(len(secs))) // .shstrtab is last
	return out
}

const (
	synText = 0x1000
	synEH   = 0x4000
	synHdr  = 0x3800
	synGot  = 0x6000
)

func textSec() synSec {
	return synSec{name: ".text", typ: elf.SHT_NOBITS, flags: elf.SHF_ALLOC | elf.SHF_EXECINSTR, addr: synText, data: make([]byte, 0x2000)}
}

func readBytes(t testing.TB, b []byte) *Table {
	t.Helper()
	tab, err := Read(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

func wantRows(t *testing.T, tab *Table, want []Row) {
	t.Helper()
	if !slices.Equal(tab.Rows, want) {
		t.Errorf("rows:")
		for i := range max(len(tab.Rows), len(want)) {
			var g, w string
			if i < len(tab.Rows) {
				g = hexPC(tab.Rows[i].PC) + " " + tab.Rows[i].String()
			}
			if i < len(want) {
				w = hexPC(want[i].PC) + " " + want[i].String()
			}
			mark := "  "
			if g != w {
				mark = "!="
			}
			t.Errorf("  got %-28s %s want %s", g, mark, w)
		}
	}
}

func hexPC(pc uint64) string { return fmt.Sprintf("%#x", pc) }

func sp(pc uint64, off int32) Row { return Row{PC: pc, CFA: CFASP, CFAOffset: off} }
func fp(pc uint64, off int32) Row { return Row{PC: pc, CFA: CFAFP, CFAOffset: off} }
func withFP(r Row, off int32) Row {
	r.FP, r.FPOffset = FPAtCFA, off
	return r
}
func fpInvalid(r Row) Row   { r.FP = FPInvalid; return r }
func invalid(pc uint64) Row { return Row{PC: pc} }

// The initial instructions every synthetic CIE uses: CFA = rsp+8, RA at CFA-8.
var initIns = []byte{cfaDefCFA, RegSP, 8, cfaOffset | regRA, 1}

func TestDebugFrame64BitV4(t *testing.T) {
	w := &cfiWriter{debug: true}
	c := w.cie(true, 4, "", 4, -8, regRA, nil, initIns...)
	w.fde(true, c, func() { w.u64(synText); w.u64(0x40) }, nil,
		cfaAdvanceLoc|1, // code alignment 4: 0x1004
		cfaDefCFAOffset, 16,
		cfaOffset|RegFP, 2,
		cfaSetLoc, 0x10, 0x10, 0, 0, 0, 0, 0, 0,
		cfaDefCFARegister, RegFP,
		cfaAdvanceLoc1, 4, // 0x1020
		cfaUndefined, RegFP,
		cfaAdvanceLoc2, 2, 0, // 0x1028
		cfaDefCFA, RegSP, 8,
		cfaAdvanceLoc4, 1, 0, 0, 0, // 0x102c
		cfaRestore|RegFP,
		cfaAdvanceLoc|100, // past the end: ignored
		cfaDefCFAOffset, 99,
	)
	tab := readBytes(t, synELF(elf.ET_DYN, textSec(), synSec{name: ".debug_frame", typ: elf.SHT_PROGBITS, data: w.b}))
	if tab.Source != ".debug_frame" {
		t.Errorf("source %q", tab.Source)
	}
	wantRows(t, tab, []Row{
		sp(0x1000, 8),
		withFP(sp(0x1004, 16), -16),
		withFP(fp(0x1010, 16), -16),
		fpInvalid(fp(0x1020, 16)),
		fpInvalid(sp(0x1028, 8)),
		sp(0x102c, 8),
		invalid(0x1040),
	})
}

func TestDebugFrameCIEVersions(t *testing.T) {
	w := &cfiWriter{debug: true}
	v3 := w.cie(false, 3, "", 1, -8, regRA, nil, initIns...)
	eh := w.cie(false, 1, "eh", 1, -8, regRA, nil, initIns...)
	sig := w.cie(false, 1, "S", 1, -8, regRA, nil, initIns...)
	bad := w.cie(false, 1, "x", 1, -8, regRA, nil, initIns...)
	w.fde(false, v3, func() { w.u64(0x1000); w.u64(0x10) }, nil, cfaAdvanceLoc|4, cfaDefCFAOffsetSF, 0x7e) // -2*-8
	w.fde(false, eh, func() { w.u64(0x1010); w.u64(0x10) }, nil, cfaDefCFASF, RegFP, 0x7e)
	w.fde(false, sig, func() { w.u64(0x1020); w.u64(0x10) }, nil)
	w.fde(false, bad, func() { w.u64(0x1030); w.u64(0x10) }, nil)
	w.fde(false, 0x7fff0, func() { w.u64(0x1040); w.u64(0x10) }, nil) // CIE pointer out of range
	w.fde(false, v3, func() { w.u64(0x1050); w.u64(0x10) }, nil)
	tab := readBytes(t, synELF(elf.ET_EXEC, synSec{name: ".debug_frame", typ: elf.SHT_PROGBITS, data: w.b}))
	wantRows(t, tab, []Row{
		sp(0x1000, 8),
		sp(0x1004, 16),
		fp(0x1010, 16),
		{PC: 0x1020, CFA: CFASignal},
		invalid(0x1030),
		sp(0x1050, 8),
		invalid(0x1060),
	})
}

// ehFrameFile builds an .eh_frame (and optionally .eh_frame_hdr listing hdrFDEs) from the
// FDEs the callback writes.
func ehFrameFile(t testing.TB, withHdr bool, write func(w *cfiWriter) (fdeOffs []int)) []byte {
	t.Helper()
	w := &cfiWriter{addr: synEH}
	offs := write(w)
	w.u32(0) // terminator
	secs := []synSec{textSec(),
		{name: ".got", typ: elf.SHT_NOBITS, flags: elf.SHF_ALLOC | elf.SHF_WRITE, addr: synGot},
		{name: ".eh_frame", typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC, addr: synEH, data: w.b}}
	if withHdr {
		h := &cfiWriter{addr: synHdr}
		h.u8(1, pePCRel|peSdata4, peUdata4, peDataRel|peSdata4)
		h.pcrel4(synEH)
		h.u32(uint32(len(offs)))
		for _, o := range offs {
			// The initial location is not used; write garbage to prove it.
			h.u32(0xdead)
			h.u32(uint32(synEH + uint64(o) - synHdr))
		}
		secs = append(secs, synSec{name: ".eh_frame_hdr", typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC, addr: synHdr, data: h.b})
	}
	return synELF(elf.ET_DYN, secs...)
}

func TestPointerEncodings(t *testing.T) {
	type enc struct {
		enc   byte
		write func(w *cfiWriter, start uint64)
	}
	encs := []enc{
		{peAbsptr, func(w *cfiWriter, s uint64) { w.u64(s); w.u64(0x10) }},
		{peULEB128, func(w *cfiWriter, s uint64) { w.uleb(s); w.uleb(0x10) }},
		{peUdata2, func(w *cfiWriter, s uint64) { w.u16(uint16(s)); w.u16(0x10) }},
		{peUdata4, func(w *cfiWriter, s uint64) { w.u32(uint32(s)); w.u32(0x10) }},
		{peUdata8, func(w *cfiWriter, s uint64) { w.u64(s); w.u64(0x10) }},
		{peSLEB128, func(w *cfiWriter, s uint64) { w.sleb(int64(s)); w.sleb(0x10) }},
		{peSdata2, func(w *cfiWriter, s uint64) { w.u16(uint16(s)); w.u16(0x10) }},
		{peSdata8, func(w *cfiWriter, s uint64) { w.u64(s); w.u64(0x10) }},
		{pePCRel | peSdata4, func(w *cfiWriter, s uint64) { w.pcrel4(s); w.u32(0x10) }},
		{pePCRel | peSLEB128, func(w *cfiWriter, s uint64) { w.sleb(int64(s - w.here())); w.sleb(0x10) }},
		{peDataRel | peSdata4, func(w *cfiWriter, s uint64) { w.u32(uint32(s - synGot)); w.u32(0x10) }},
		{peTextRel | peUdata4, func(w *cfiWriter, s uint64) { w.u32(uint32(s - synText)); w.u32(0x10) }},
		{peAligned, func(w *cfiWriter, s uint64) {
			for w.here()%8 != 0 {
				w.u8(0)
			}
			w.u64(s)
			w.u64(0x10)
		}},
	}
	for _, withHdr := range []bool{false, true} {
		var want []Row
		b := ehFrameFile(t, withHdr, func(w *cfiWriter) (offs []int) {
			for i, e := range encs {
				// A personality with an indirect pointer and an LSDA, like g++ output.
				c := w.cie(false, 1, "zPLR", 1, -8, regRA, func() {
					w.u8(peIndirect | pePCRel | peSdata4)
					w.u32(0x1234)
					w.u8(pePCRel | peSdata4)
					w.u8(e.enc)
				}, initIns...)
				start := synText + 0x100*uint64(i)
				// The 64-bit format puts pc_begin 4 bytes off an 8-byte boundary, which
				// DW_EH_PE_aligned must skip.
				dwarf64 := e.enc == peAligned
				offs = append(offs, w.fde(dwarf64, c, func() { e.write(w, start) }, []byte{0, 0, 0, 0}, // LSDA
					cfaAdvanceLoc|1, cfaDefCFAOffset, byte(16+i)))
				want = append(want, sp(start, 8), sp(start+1, int32(16+i)), invalid(start+0x10))
			}
			return offs
		})
		tab := readBytes(t, b)
		wantRows(t, tab, want)
	}
}

func TestHdrTableIsAuthoritative(t *testing.T) {
	// The header lists only the second FDE (and an address outside .eh_frame); the first,
	// like an FDE of discarded code, must not appear.
	b := ehFrameFile(t, true, func(w *cfiWriter) []int {
		c := w.cie(false, 1, "zR", 1, -8, regRA, func() { w.u8(pePCRel | peSdata4) }, initIns...)
		w.fde(false, c, func() { w.pcrel4(0x1000); w.u32(0x10) }, noAug)
		f2 := w.fde(false, c, func() { w.pcrel4(0x1100); w.u32(0x10) }, noAug)
		return []int{f2, 0x100000}
	})
	wantRows(t, readBytes(t, b), []Row{sp(0x1100, 8), invalid(0x1110)})
}

func TestOverlappingFDEs(t *testing.T) {
	b := ehFrameFile(t, false, func(w *cfiWriter) []int {
		c := w.cie(false, 1, "zR", 1, -8, regRA, func() { w.u8(peUdata4) }, initIns...)
		f := func(start, size uint32, off byte) {
			w.fde(false, c, func() { w.u32(start); w.u32(size) }, noAug, cfaDefCFAOffset, off)
		}
		f(0x1080, 0x180, 16) // overlaps the next: clipped to start at 0x1100
		f(0x1000, 0x100, 24)
		f(0x1000, 0x10, 32) // same start as the previous, which comes first: dropped
		f(0x1180, 0x20, 40) // inside the first: dropped
		f(0x1400, 0, 48)    // empty
		f(0x1300, 0x10, 56) // after a gap
		f(0x1310, 0x10, 64) // adjacent: no invalid row between
		f(0x1320, 0x10, 64) // same rule: merged
		return nil
	})
	wantRows(t, readBytes(t, b), []Row{
		sp(0x1000, 24),
		sp(0x1100, 16),
		invalid(0x1200),
		sp(0x1300, 56),
		sp(0x1310, 64),
		invalid(0x1330),
	})
}

func TestMalformedPrograms(t *testing.T) {
	b := ehFrameFile(t, false, func(w *cfiWriter) []int {
		c := w.cie(false, 1, "zR", 1, -8, regRA, func() { w.u8(peUdata4) }, initIns...)
		f := func(start uint32, ins ...byte) {
			w.fde(false, c, func() { w.u32(start); w.u32(0x10) }, noAug, ins...)
		}
		// An unknown opcode: the rows before it stand, the rest of the range is invalid. The
		// rules the kernel cannot follow (a CFA on r12, the return address elsewhere) are
		// rows of their own, so that the walks that end there are counted by kind.
		f(0x1000, cfaAdvanceLoc|2, cfaDefCFAOffset, 16, cfaAdvanceLoc|2, 0x3f, cfaAdvanceLoc|2, cfaDefCFAOffset, 8)
		// The others start with a good row, so that the bad one shows.
		f(0x1100, cfaAdvanceLoc|2, cfaRestoreState)                                          // nothing to restore
		f(0x1200, cfaAdvanceLoc|2, cfaSetLoc, 0x00, 0x12, 0, 0)                              // backwards
		f(0x1300, cfaAdvanceLoc|1, cfaDefCFA, RegSP, 0x80, 0x80, 0x80, 0x80, 0x10)           // offset 1<<32
		f(0x1400, cfaAdvanceLoc|1, cfaDefCFA, 12, 8)                                         // CFA on r12
		f(0x1500, cfaAdvanceLoc|1, cfaOffset|regRA, 2)                                       // RA at CFA-16
		f(0x1600, cfaAdvanceLoc|1, cfaRegister, regRA, 1)                                    // RA in rdx
		f(0x1700, cfaAdvanceLoc|1, cfaOffsetExtendedSF, RegFP, 0x80, 0x80, 0x80, 0x80, 0x08) // rbp too far
		// def_cfa_offset after an expression keeps the expression, here rsp+16.
		f(0x1800, cfaAdvanceLoc|1, cfaDefCFAExpression, 2, 0x77, 0x10, cfaAdvanceLoc|1, cfaDefCFAOffset, 32)
		// Seven bytes of instructions need no padding, so the operand is really missing.
		f(0x1900, cfaAdvanceLoc|1, cfaNop, cfaNop, cfaNop, cfaNop, cfaNop, cfaDefCFAOffset)
		f(0x1a00, cfaAdvanceLoc|1, cfaExpression, RegFP, 5, 0x77) // block beyond the end
		f(0x1b00, append([]byte{cfaAdvanceLoc | 1}, bytes.Repeat([]byte{cfaRememberState}, maxStateStack+1)...)...)
		return nil
	})
	wantRows(t, readBytes(t, b), []Row{
		sp(0x1000, 8), sp(0x1002, 16), invalid(0x1004),
		sp(0x1100, 8), invalid(0x1102),
		sp(0x1200, 8), invalid(0x1202),
		sp(0x1300, 8), invalid(0x1301),
		sp(0x1400, 8), {PC: 0x1401, CFA: CFAReg, CFAReg: 12, CFAOffset: 8}, invalid(0x1410),
		sp(0x1500, 8), {PC: 0x1501, CFA: CFARAElsewhere}, invalid(0x1510),
		sp(0x1600, 8), {PC: 0x1601, CFA: CFARAElsewhere}, invalid(0x1610),
		sp(0x1700, 8), fpInvalid(sp(0x1701, 8)), invalid(0x1710),
		sp(0x1800, 8), sp(0x1801, 16), invalid(0x1810),
		sp(0x1900, 8), invalid(0x1901),
		sp(0x1a00, 8), invalid(0x1a01),
		sp(0x1b00, 8), invalid(0x1b01),
	})
}
