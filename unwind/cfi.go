package unwind

import (
	"encoding/binary"
	"math"

	"github.com/sonde-profiler/sonde/internal/leb128"
)

// Pointer encodings (DW_EH_PE_*) used by .eh_frame and .eh_frame_hdr.
const (
	peAbsptr  = 0x00
	peULEB128 = 0x01
	peUdata2  = 0x02
	peUdata4  = 0x03
	peUdata8  = 0x04
	peSLEB128 = 0x09
	peSdata2  = 0x0a
	peSdata4  = 0x0b
	peSdata8  = 0x0c

	pePCRel   = 0x10
	peTextRel = 0x20
	peDataRel = 0x30
	peFuncRel = 0x40
	peAligned = 0x50

	peIndirect = 0x80
	peOmit     = 0xff
)

// reader decodes little-endian DWARF data. Errors are sticky so that parsing code reads
// like the format and checks once per entry; every read past the end yields zero.
type reader struct {
	b   []byte
	off int
	bad bool
}

func (r *reader) need(n int) bool {
	if r.bad || n < 0 || n > len(r.b)-r.off {
		r.bad = true
		return false
	}
	return true
}

func (r *reader) u8() uint8 {
	if !r.need(1) {
		return 0
	}
	v := r.b[r.off]
	r.off++
	return v
}

func (r *reader) u16() uint16 {
	if !r.need(2) {
		return 0
	}
	v := binary.LittleEndian.Uint16(r.b[r.off:])
	r.off += 2
	return v
}

func (r *reader) u32() uint32 {
	if !r.need(4) {
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v
}

func (r *reader) u64() uint64 {
	if !r.need(8) {
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v
}

// uint reads an n-byte unsigned value (n = 1, 2, 4 or 8).
func (r *reader) uint(n int) uint64 {
	switch n {
	case 1:
		return uint64(r.u8())
	case 2:
		return uint64(r.u16())
	case 4:
		return uint64(r.u32())
	case 8:
		return r.u64()
	}
	r.bad = true
	return 0
}

func (r *reader) uleb() uint64 {
	if r.bad {
		return 0
	}
	v, n := leb128.Uint(r.b[r.off:])
	if n == 0 {
		r.bad = true
	}
	r.off += n
	return v
}

func (r *reader) sleb() int64 {
	if r.bad {
		return 0
	}
	v, n := leb128.Int(r.b[r.off:])
	if n == 0 {
		r.bad = true
	}
	r.off += n
	return v
}

func (r *reader) skip(n uint64) {
	if n > uint64(len(r.b)-r.off) {
		r.bad = true
		return
	}
	r.off += int(n)
}

// cstring returns the NUL-terminated string at the cursor without copying.
func (r *reader) cstring() []byte {
	if r.bad {
		return nil
	}
	for i := r.off; i < len(r.b); i++ {
		if r.b[i] == 0 {
			s := r.b[r.off:i]
			r.off = i + 1
			return s
		}
	}
	r.bad = true
	return nil
}

// bases are the addresses DW_EH_PE_textrel and _datarel values are relative to.
type bases struct {
	text, data uint64
}

// ptr decodes a pointer in encoding enc. addr is the virtual address of r.b[0], for pcrel
// and aligned; fn is the function start for funcrel. Indirect pointers are decoded but not
// dereferenced: the cell they name is filled at run time by relocations, so the file cannot
// answer; indirect reports whether the caller got such an address.
func (r *reader) ptr(enc uint8, addrSize int, addr uint64, b bases, fn uint64) (v uint64, indirect bool) {
	if enc == peOmit {
		r.bad = true
		return 0, false
	}
	fieldAddr := addr + uint64(r.off)
	var base uint64
	switch enc & 0x70 {
	case 0:
	case pePCRel:
		base = fieldAddr
	case peTextRel:
		base = b.text
	case peDataRel:
		base = b.data
	case peFuncRel:
		base = fn
	case peAligned:
		a := uint64(addrSize)
		if pad := (a - fieldAddr%a) % a; pad != 0 {
			r.skip(pad)
		}
		return r.uint(addrSize), enc&peIndirect != 0
	default:
		r.bad = true
		return 0, false
	}
	return base + r.value(enc, addrSize), enc&peIndirect != 0
}

// value reads the data part of a pointer encoding, with no base applied: FDE address
// ranges use only the format of the FDE's encoding.
func (r *reader) value(enc uint8, addrSize int) uint64 {
	switch enc & 0x0f {
	case peAbsptr:
		return r.uint(addrSize)
	case peULEB128:
		return r.uleb()
	case peUdata2:
		return uint64(r.u16())
	case peUdata4:
		return uint64(r.u32())
	case peUdata8:
		return r.u64()
	case peSLEB128:
		return uint64(r.sleb())
	case peSdata2:
		return uint64(int64(int16(r.u16())))
	case peSdata4:
		return uint64(int64(int32(r.u32())))
	case peSdata8:
		return r.u64()
	}
	r.bad = true
	return 0
}

// frameSection is one call frame section as loaded in memory.
type frameSection struct {
	data  []byte
	addr  uint64 // virtual address of data[0]; 0 for the non-allocated .debug_frame
	debug bool   // .debug_frame conventions: CIE ids are all ones and CIE pointers are offsets
	bases bases
	// stopAtZero ends a linear walk at a zero length. A section's own size bounds the walk
	// otherwise, and linkers leave zero terminators of input files in the middle.
	stopAtZero bool
}

// cie is a parsed Common Information Entry.
type cie struct {
	codeAlign uint64
	dataAlign int64
	raReg     uint64
	fdeEnc    uint8
	addrSize  uint8
	segSize   uint8
	augData   bool // 'z': FDEs carry an augmentation length
	signal    bool // 'S'
	ins       []byte
	insAddr   uint64

	// init is the state after the initial instructions, computed once for all FDEs.
	init             state
	initDone, initOK bool
}

// fde is a parsed Frame Description Entry. ins aliases the section data.
type fde struct {
	start, end uint64
	cie        *cie
	// The instructions are the section's bytes from insOff to insEnd (a section is at
	// most maxSectionSize): a large library's list of FDEs (Debian's libpython3.11 has
	// 6 100) is 32 bytes an FDE rather than 56.
	insOff, insEnd uint32
}

// ins returns the FDE's instructions and the address they are at.
func (f *fde) ins(s *frameSection) ([]byte, uint64) {
	return s.data[f.insOff:f.insEnd], s.addr + uint64(f.insOff)
}

// entryHeader reads an entry's length and id at off. It returns the reader positioned after
// the id, the end offset of the entry, the id and the id field's offset.
func (s *frameSection) entryHeader(off int) (r reader, end int, id uint64, idOff int, is64 bool, ok bool) {
	r = reader{b: s.data, off: off}
	length := uint64(r.u32())
	if length == 0xffffffff {
		length = r.u64()
		is64 = true
	}
	if r.bad || length > uint64(len(s.data)-r.off) {
		return r, 0, 0, 0, false, false
	}
	end = r.off + int(length)
	r.b = s.data[:end]
	idOff = r.off
	if is64 {
		id = r.u64()
	} else {
		id = uint64(r.u32())
	}
	return r, end, id, idOff, is64, !r.bad
}

// isCIE tells a CIE from an FDE by its id field.
func (s *frameSection) isCIE(id uint64, is64 bool) bool {
	if !s.debug {
		return id == 0
	}
	if is64 {
		return id == math.MaxUint64
	}
	return id == 0xffffffff
}

// cieOffset returns where an FDE's CIE is, from its CIE pointer.
func (s *frameSection) cieOffset(id uint64, idOff int) (int, bool) {
	if s.debug {
		if id >= uint64(len(s.data)) {
			return 0, false
		}
		return int(id), true
	}
	// In .eh_frame the pointer counts back from the id field itself.
	if id > uint64(idOff) {
		return 0, false
	}
	return idOff - int(id), true
}

// parseCIE parses the CIE at off. It returns nil for a CIE it cannot use (unknown
// augmentation, bad version, truncation); its FDEs are then skipped.
func (s *frameSection) parseCIE(off int) *cie {
	r, end, id, _, is64, ok := s.entryHeader(off)
	if !ok || !s.isCIE(id, is64) {
		return nil
	}
	c := &cie{addrSize: 8}
	version := r.u8()
	switch {
	case version == 1 || version == 3:
	case version == 4 && s.debug:
	default:
		return nil
	}
	aug := r.cstring()
	if len(aug) >= 2 && aug[0] == 'e' && aug[1] == 'h' {
		// gcc 2.x: the address of an exception table, which unwinding does not need.
		r.skip(8)
		aug = aug[2:]
	}
	if version == 4 {
		c.addrSize = r.u8()
		c.segSize = r.u8()
		if c.addrSize != 4 && c.addrSize != 8 {
			return nil
		}
	}
	c.codeAlign = r.uleb()
	c.dataAlign = r.sleb()
	if version == 1 {
		c.raReg = uint64(r.u8())
	} else {
		c.raReg = r.uleb()
	}
	if len(aug) > 0 && aug[0] == 'z' {
		c.augData = true
		n := r.uleb()
		if r.bad || n > uint64(end-r.off) {
			return nil
		}
		augEnd := r.off + int(n)
		ar := reader{b: s.data[:augEnd], off: r.off}
	letters:
		for _, ch := range aug[1:] {
			switch ch {
			case 'R':
				c.fdeEnc = ar.u8()
			case 'L':
				ar.u8() // LSDA encoding: the LSDA pointer sits in the FDE's skipped augmentation data
			case 'P':
				enc := ar.u8()
				// The personality routine is for exception handling only; an indirect one is
				// a GOT slot the file leaves unset, so read past it without following it.
				ar.ptr(enc, int(c.addrSize), s.addr, s.bases, 0)
			case 'S':
				c.signal = true
			case 'B', 'G':
				// arm64 BTI and MTE markers; no data.
			default:
				// 'z' bounds the data, so later letters can be ignored safely.
				break letters
			}
		}
		if ar.bad {
			return nil
		}
		r.off = augEnd
	} else {
		// Without 'z' only letters without data can be skipped.
		for _, ch := range aug {
			switch ch {
			case 'S':
				c.signal = true
			default:
				return nil
			}
		}
	}
	if r.bad {
		return nil
	}
	c.ins = s.data[r.off:end]
	c.insAddr = s.addr + uint64(r.off)
	return c
}

// parseFDE parses the FDE at off, looking its CIE up in (or adding it to) cies.
func (s *frameSection) parseFDE(off int, cies map[int]*cie) (fde, bool) {
	r, end, id, idOff, is64, ok := s.entryHeader(off)
	if !ok || s.isCIE(id, is64) {
		return fde{}, false
	}
	co, ok := s.cieOffset(id, idOff)
	if !ok {
		return fde{}, false
	}
	c, seen := cies[co]
	if !seen {
		c = s.parseCIE(co)
		cies[co] = c
	}
	if c == nil {
		return fde{}, false
	}
	var start, length uint64
	if s.debug && !c.augData {
		r.skip(uint64(c.segSize))
		start = r.uint(int(c.addrSize))
		length = r.uint(int(c.addrSize))
	} else {
		var ind bool
		start, ind = r.ptr(c.fdeEnc, int(c.addrSize), s.addr, s.bases, 0)
		if ind {
			return fde{}, false
		}
		length = r.value(c.fdeEnc, int(c.addrSize))
	}
	if c.augData {
		r.skip(r.uleb())
	}
	if r.bad || start+length < start || end > math.MaxUint32 {
		return fde{}, false
	}
	return fde{
		start:  start,
		end:    start + length,
		cie:    c,
		insOff: uint32(r.off),
		insEnd: uint32(end),
	}, true
}

// walk lists every FDE of the section in file order.
func (s *frameSection) walk(cies map[int]*cie, fdes []fde) []fde {
	for off := 0; off < len(s.data); {
		r := reader{b: s.data, off: off}
		if l := r.u32(); l == 0 && !r.bad {
			if s.stopAtZero {
				break
			}
			off += 4
			continue
		}
		_, end, id, _, is64, ok := s.entryHeader(off)
		if !ok {
			break
		}
		if !s.isCIE(id, is64) {
			if f, ok := s.parseFDE(off, cies); ok {
				fdes = append(fdes, f)
			}
		}
		off = end
	}
	return fdes
}

// ehHdr is a parsed .eh_frame_hdr.
type ehHdr struct {
	ehFrame  uint64 // address of .eh_frame
	table    reader // positioned at the binary search table
	tableEnc uint8
	count    uint64
	addr     uint64
	bases    bases
}

// parseHdr parses .eh_frame_hdr. count is 0 when the linker could not build the table.
func parseHdr(hdr []byte, hdrAddr, text uint64) (ehHdr, bool) {
	r := reader{b: hdr}
	if r.u8() != 1 {
		return ehHdr{}, false
	}
	ptrEnc, countEnc, tableEnc := r.u8(), r.u8(), r.u8()
	h := ehHdr{addr: hdrAddr, tableEnc: tableEnc, bases: bases{text: text, data: hdrAddr}}
	var ind bool
	h.ehFrame, ind = r.ptr(ptrEnc, 8, hdrAddr, h.bases, 0)
	if r.bad || ind {
		return ehHdr{}, false
	}
	if countEnc == peOmit || tableEnc == peOmit {
		return h, true
	}
	h.count, ind = r.ptr(countEnc, 8, hdrAddr, h.bases, 0)
	// Every entry takes at least two bytes; a larger count is corrupt.
	if r.bad || ind || h.count > uint64(len(hdr)-r.off)/2 {
		h.count = 0
	}
	h.table = r
	return h, true
}

// fdes appends the FDEs the binary search table lists, in its sorted order. ok is false
// when the table is unusable and the caller should walk .eh_frame instead.
func (h *ehHdr) fdes(eh *frameSection, cies map[int]*cie, fdes []fde) (_ []fde, ok bool) {
	n := len(fdes)
	if !h.walk(eh, cies, func(f fde) bool { fdes = append(fdes, f); return true }) {
		return fdes[:n], false
	}
	return fdes, true
}

// walk hands yield the FDEs the binary search table lists, in its order, until yield
// returns false. ok is false when the table is unusable.
func (h *ehHdr) walk(eh *frameSection, cies map[int]*cie, yield func(fde) bool) (ok bool) {
	if h.count == 0 {
		return false
	}
	r := h.table
	for i := uint64(0); i < h.count; i++ {
		r.ptr(h.tableEnc, 8, h.addr, h.bases, 0) // initial location: the FDE itself is authoritative
		fa, ind := r.ptr(h.tableEnc, 8, h.addr, h.bases, 0)
		if r.bad {
			return false
		}
		if ind || fa < eh.addr || fa-eh.addr >= uint64(len(eh.data)) {
			continue
		}
		if f, ok := eh.parseFDE(int(fa-eh.addr), cies); ok && !yield(f) {
			return true
		}
	}
	return true
}
