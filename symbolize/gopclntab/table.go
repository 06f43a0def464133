package gopclntab

import (
	"bytes"
	"debug/elf"
	"debug/gosym"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
)

// ErrNotGo means the file has no pclntab: not a Go binary.
var ErrNotGo = errors.New("no go pclntab")

// Frame is one source-level frame at an address.
type Frame struct {
	Function string // as the runtime names it, e.g. "main.(*server).handle"
	File     string
	Line     int64
}

const (
	magic12  = 0xfffffffb // Go 1.2 to 1.15
	magic116 = 0xfffffffa // Go 1.16 and 1.17
	magic118 = 0xfffffff0 // Go 1.18 and 1.19
	magic120 = 0xfffffff1 // Go 1.20 and later

	// The runtime's indexes of the inline tables among a function's pcdata and funcdata.
	pcdataInlTreeIndex = 2
	funcdataInlTree    = 3

	// maxInlineDepth bounds the inlined frames of one address: the compiler's
	// inlining budget keeps real chains short, and a hostile tree must not make a
	// lookup long.
	maxInlineDepth = 64
	// maxInlineTree bounds the entries of one function's inline tree.
	maxInlineTree = 1 << 16
	// maxString bounds the names read from the tables.
	maxString = 1 << 16
	// maxInlineSteps bounds the pcvalue steps decoded while sizing inline trees at
	// load: hostile functions sharing one huge table must not make loading quadratic.
	maxInlineSteps = 1 << 26
)

// Table names addresses of one Go binary. It is immutable once built and safe
// for concurrent lookups.
type Table struct {
	order   binary.ByteOrder
	go120   bool // the layout of Go 1.20 and later, else of 1.18 and 1.19
	quantum uint64
	nfunc   int
	text    uint64 // the address function entries are offsets from

	funcnames, cutab, filetab, pctab, functab []byte

	// Inline trees: copied out of a file that was read, inl holds all functions'
	// back to back and inlIndex says where each one's is; in a mapped file, lookups
	// read them where they lie, in the go:func.* data at gofunc.
	inl      []byte
	inlIndex []inlRef
	mem      *image // the mapped file, for trees read in place; nil otherwise
	gofunc   uint64

	legacy *gosym.Table // Go 1.2 to 1.17

	size int64 // heap bytes held
}

type inlRef struct{ off, n uint32 }

// Load reads the pclntab of f. It returns ErrNotGo for files without one.
//
// file is f's contents when the caller has mapped the file, else nil. A table read
// from a mapping keeps reading it (the pclntab and the inline trees, where they lie)
// and holds almost nothing on the heap; the caller keeps the mapping while it uses
// the table and reads it under mmapfile.Guard. Without one, the table copies the
// pclntab and the inline trees.
func Load(f *elf.File, file []byte) (t *Table, err error) {
	// Offsets in the tables index further tables; hostile ones must cost an error.
	defer func() {
		if p := recover(); p != nil {
			if fe := mmapfile.Fault(p); fe != nil {
				t, err = nil, fe
				return
			}
			t, err = nil, fmt.Errorf("corrupt pclntab: %v", p)
		}
	}()
	img := newImage(f, file)
	data, addr, err := findPclntab(f, img)
	if err != nil {
		return nil, err
	}
	if len(data) < 8 {
		return nil, errors.New("pclntab header truncated")
	}
	order := f.ByteOrder
	text := textAddr(f)
	switch m := order.Uint32(data); m {
	case magic12, magic116:
		return loadLegacy(f, img, data, text)
	case magic118, magic120:
		t = &Table{order: order, go120: m == magic120}
	default:
		return nil, fmt.Errorf("pclntab magic %#x: unknown go version", m)
	}
	if err := t.parseHeader(data); err != nil {
		return nil, err
	}
	img.ptrSize = int(data[7])
	md, mdErr := findModuledata(img, addr, data, t.go120)
	// Externally linked (cgo) binaries put C code at the start of .text, before
	// runtime.text; the moduledata says where Go's code starts.
	switch {
	case mdErr == nil && md.text != 0:
		t.text = md.text
	case text != 0:
		t.text = text
	default:
		return nil, fmt.Errorf("no .text section and no moduledata: %w", mdErr)
	}
	if !img.mapped() {
		t.size = int64(len(data))
	}
	// The runtime keeps inline trees outside the pclntab proper; without the
	// moduledata to find them, addresses still get their physical functions.
	if mdErr == nil {
		if img.mapped() {
			t.mem, t.gofunc = img, md.gofunc
			img.f, img.relative = nil, nil // what Load alone needed
		} else {
			t.readInlineTrees(img, md.gofunc)
		}
	}
	return t, nil
}

// Inlining reports whether the table knows inline trees.
func (t *Table) Inlining() bool { return len(t.inl) > 0 || t.mem != nil }

// SizeBytes estimates the heap memory the table holds; a mapped file's pages are not
// counted.
func (t *Table) SizeBytes() int64 {
	n := int64(unsafe.Sizeof(Table{})) + t.size + int64(cap(t.inl)) + int64(cap(t.inlIndex))*8
	if t.mem != nil {
		n += int64(unsafe.Sizeof(image{})) + int64(cap(t.mem.segs))*int64(unsafe.Sizeof(segment{}))
	}
	return n
}

// Covers reports whether a Go function of the table holds pc: the table names the
// code there, and nothing else needs to.
func (t *Table) Covers(pc uint64) bool {
	if t.legacy != nil {
		return t.legacy.PCToFunc(pc) != nil
	}
	_, ok := t.findFunc(pc)
	return ok
}

func findPclntab(f *elf.File, img *image) (data []byte, addr uint64, err error) {
	for _, name := range []string{".gopclntab", ".data.rel.ro.gopclntab"} {
		s := f.Section(name)
		if s == nil || s.Type == elf.SHT_NOBITS {
			continue
		}
		data, err := img.section(s)
		if err != nil {
			return nil, 0, fmt.Errorf("read %s: %w", name, err)
		}
		return data, s.Addr, nil
	}
	if len(f.Sections) > 0 {
		return nil, 0, ErrNotGo
	}
	// Section headers can be stripped (sstrip); the runtime needs the table loaded,
	// so it is in a segment, starting with its magic on a pointer boundary.
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Filesz == 0 || p.Filesz > 1<<31 {
			continue
		}
		seg, ok := img.read(p.Vaddr, int32(p.Filesz))
		if !ok {
			continue
		}
		for off := 0; off+8 <= len(seg); off += 4 {
			m := f.ByteOrder.Uint32(seg[off:])
			if (m == magic118 || m == magic120 || m == magic116) && plausibleHeader(seg[off:]) {
				return seg[off:], p.Vaddr + uint64(off), nil
			}
		}
	}
	return nil, 0, ErrNotGo
}

func plausibleHeader(b []byte) bool {
	return len(b) >= 8 && b[4] == 0 && b[5] == 0 && (b[6] == 1 || b[6] == 2 || b[6] == 4) && (b[7] == 4 || b[7] == 8)
}

// textAddr is where function entries count from: the runtime.text symbol, which
// the linker puts at the start of .text.
func textAddr(f *elf.File) uint64 {
	if s := f.Section(".text"); s != nil {
		return s.Addr
	}
	return 0
}

func (t *Table) parseHeader(data []byte) error {
	if !plausibleHeader(data) {
		return fmt.Errorf("pclntab header % x: bad quantum or pointer size", data[:8])
	}
	t.quantum = uint64(data[6])
	ptr := int(data[7])
	word := func(i int) uint64 {
		off := 8 + i*ptr
		if off+ptr > len(data) {
			return math.MaxUint64
		}
		if ptr == 4 {
			return uint64(t.order.Uint32(data[off:]))
		}
		return t.order.Uint64(data[off:])
	}
	nfunc := word(0)
	var tabs [5][]byte
	for i := range tabs {
		off := word(3 + i) // funcname, cu, file, pc and func tables, in header order
		if off > uint64(len(data)) {
			return fmt.Errorf("pclntab table %d at %#x is past the end (%#x)", i, off, len(data))
		}
		tabs[i] = data[off:]
	}
	t.funcnames, t.cutab, t.filetab, t.pctab, t.functab = tabs[0], tabs[1], tabs[2], tabs[3], tabs[4]
	if nfunc > uint64(len(t.functab)/8) || nfunc == 0 {
		return fmt.Errorf("pclntab lists %d functions in a %d-byte function table", nfunc, len(t.functab))
	}
	// The table holds nfunc+1 entries: the last gives the end of the last function.
	if (nfunc+1)*8 > uint64(len(t.functab)) {
		return errors.New("pclntab function table truncated")
	}
	t.nfunc = int(nfunc)
	return nil
}

func loadLegacy(f *elf.File, img *image, data []byte, text uint64) (*Table, error) {
	var symtab []byte
	if s := f.Section(".gosymtab"); s != nil && s.Type != elf.SHT_NOBITS {
		symtab, _ = img.section(s)
	}
	lt, err := gosym.NewTable(symtab, gosym.NewLineTable(data, text))
	if err != nil {
		return nil, fmt.Errorf("parse pclntab: %w", err)
	}
	size := int64(0)
	if !img.mapped() {
		size = int64(len(data) + len(symtab))
	}
	// debug/gosym holds a Func and a Sym with its name for every function.
	for _, fn := range lt.Funcs {
		size += 160
		if fn.Sym != nil {
			size += int64(len(fn.Name))
		}
	}
	return &Table{legacy: lt, size: size}, nil
}

func (t *Table) u32(b []byte, off uint64) (uint32, bool) {
	if off > uint64(len(b)) || uint64(len(b))-off < 4 {
		return 0, false
	}
	return t.order.Uint32(b[off:]), true
}

// funcInfo is the part of a runtime _func record a lookup needs.
type funcInfo struct {
	entry             uint64
	nameOff           uint32
	pcfile, pcln      uint32
	npcdata, cuOffset uint32
	nfuncdata         uint32
	tables            uint64 // offset in functab of the pcdata array, funcdata after it
}

func (t *Table) funcAt(i int) (fn funcInfo, ok bool) {
	if i < 0 || i >= t.nfunc {
		return fn, false
	}
	entryOff, ok1 := t.u32(t.functab, uint64(i)*8)
	funcOff, ok2 := t.u32(t.functab, uint64(i)*8+4)
	hdr := uint64(40) // entryOff … nfuncdata in Go 1.18 and 1.19
	if t.go120 {
		hdr = 44 // startLine joined in 1.20
	}
	if !ok1 || !ok2 || uint64(funcOff)+hdr > uint64(len(t.functab)) {
		return fn, false
	}
	b := t.functab[funcOff:]
	fn.entry = t.text + uint64(entryOff)
	fn.nameOff = t.order.Uint32(b[4:])
	fn.pcfile = t.order.Uint32(b[20:])
	fn.pcln = t.order.Uint32(b[24:])
	fn.npcdata = t.order.Uint32(b[28:])
	fn.cuOffset = t.order.Uint32(b[32:])
	fn.nfuncdata = uint32(b[hdr-1])
	fn.tables = uint64(funcOff) + hdr
	if fn.tables+4*(uint64(fn.npcdata)+uint64(fn.nfuncdata)) > uint64(len(t.functab)) {
		return fn, false
	}
	return fn, true
}

func (t *Table) pcdata(fn funcInfo, i uint32) uint32 {
	if i >= fn.npcdata {
		return 0
	}
	v, _ := t.u32(t.functab, fn.tables+4*uint64(i))
	return v
}

func (t *Table) funcdata(fn funcInfo, i uint32) (uint32, bool) {
	if i >= fn.nfuncdata {
		return 0, false
	}
	v, ok := t.u32(t.functab, fn.tables+4*uint64(fn.npcdata)+4*uint64(i))
	return v, ok && v != math.MaxUint32
}

// findFunc returns the index of the function holding pc.
func (t *Table) findFunc(pc uint64) (int, bool) {
	if pc < t.text || pc-t.text > math.MaxUint32 {
		return 0, false
	}
	off := uint32(pc - t.text)
	lo, hi := 0, t.nfunc
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		e, _ := t.u32(t.functab, uint64(m)*8)
		if e <= off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	i := lo - 1
	if i < 0 {
		return 0, false
	}
	if end, ok := t.u32(t.functab, uint64(i+1)*8); !ok || off >= end {
		return 0, false
	}
	return i, true
}

// pcvalue decodes the table at off in pctab, as the runtime's pcvalue does, and
// returns its value at target.
func (t *Table) pcvalue(off uint32, entry, target uint64) (int32, bool) {
	if off == 0 || uint64(off) >= uint64(len(t.pctab)) {
		return -1, false
	}
	p := t.pctab[off:]
	pc, val := entry, int32(-1)
	for first := true; ; first = false {
		uvdelta, n := binary.Uvarint(p)
		if n <= 0 || (uvdelta == 0 && !first) {
			return -1, false
		}
		p = p[n:]
		v := uint32(uvdelta)
		val += int32(-(v & 1) ^ (v >> 1))
		pcdelta, n := binary.Uvarint(p)
		if n <= 0 {
			return -1, false
		}
		p = p[n:]
		pc += pcdelta * t.quantum
		if target < pc {
			return val, true
		}
	}
}

// maxValue returns the largest value of the table at off, which for the inline
// index is the last entry of the function's inline tree. It counts the steps it
// decodes in *budget and gives up when that runs out.
func (t *Table) maxValue(off uint32, budget *int) int32 {
	if off == 0 || uint64(off) >= uint64(len(t.pctab)) {
		return -1
	}
	p := t.pctab[off:]
	val, maxVal := int32(-1), int32(-1)
	for first := true; ; first = false {
		if *budget--; *budget < 0 {
			return -1
		}
		uvdelta, n := binary.Uvarint(p)
		if n <= 0 || (uvdelta == 0 && !first) {
			return maxVal
		}
		p = p[n:]
		v := uint32(uvdelta)
		val += int32(-(v & 1) ^ (v >> 1))
		maxVal = max(maxVal, val)
		if _, n = binary.Uvarint(p); n <= 0 {
			return maxVal
		}
		p = p[n:]
	}
}

func cstring(b []byte, off uint64) string {
	if off >= uint64(len(b)) {
		return ""
	}
	b = b[off:]
	b = b[:min(len(b), maxString)]
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func (t *Table) funcName(nameOff uint32) string { return cstring(t.funcnames, uint64(nameOff)) }

func (t *Table) fileLine(fn funcInfo, pc uint64) (string, int64) {
	fileno, ok := t.pcvalue(fn.pcfile, fn.entry, pc)
	if !ok || fileno < 0 {
		return "", 0
	}
	line, ok := t.pcvalue(fn.pcln, fn.entry, pc)
	if !ok || line < 0 {
		line = 0
	}
	fileOff, ok := t.u32(t.cutab, 4*(uint64(fn.cuOffset)+uint64(fileno)))
	if !ok || fileOff == math.MaxUint32 {
		return "", int64(line)
	}
	return cstring(t.filetab, uint64(fileOff)), int64(line)
}

// inlinedCall is the part of the runtime's inlinedCall a lookup needs.
type inlinedCall struct {
	nameOff  uint32
	parentPc int32
}

func (t *Table) inlSize() int {
	if t.go120 {
		return 16 // funcID, pad, nameOff, parentPc, startLine
	}
	return 20 // parent, funcID, pad, file, line, func_, parentPc
}

// inlineTree says where the inline tree of function i is: in inl at ref, or, read in
// place, at tree in the mapped go:func.* data.
func (t *Table) inlineTree(i int, fn funcInfo) (ref inlRef, tree uint64, ok bool) {
	if t.mem != nil {
		off, ok := t.funcdata(fn, funcdataInlTree)
		return inlRef{n: maxInlineTree}, t.gofunc + uint64(off), ok
	}
	if i < len(t.inlIndex) && t.inlIndex[i].n > 0 {
		return t.inlIndex[i], 0, true
	}
	return inlRef{}, 0, false
}

func (t *Table) call(ref inlRef, tree uint64, ix int32) (inlinedCall, bool) {
	if ix < 0 || uint32(ix) >= ref.n {
		return inlinedCall{}, false
	}
	var b []byte
	if t.mem != nil {
		// Entries the function's inline index does not reach may lie past the
		// tree: the index read by pcvalue bounds ix, as the runtime trusts it to.
		var ok bool
		if b, ok = t.mem.read(tree+uint64(ix)*uint64(t.inlSize()), int32(t.inlSize())); !ok {
			return inlinedCall{}, false
		}
	} else {
		b = t.inl[int(ref.off)+int(ix)*t.inlSize():]
	}
	if t.go120 {
		return inlinedCall{nameOff: t.order.Uint32(b[4:]), parentPc: int32(t.order.Uint32(b[8:]))}, true
	}
	return inlinedCall{nameOff: t.order.Uint32(b[12:]), parentPc: int32(t.order.Uint32(b[16:]))}, true
}

// readInlineTrees copies every function's inline tree out of the go:func.* data at
// gofunc.
func (t *Table) readInlineTrees(img *image, gofunc uint64) {
	t.readInlineTreesFrom(func(addr uint64, n int) ([]byte, bool) { return img.read(addr, int32(n)) }, gofunc)
}

// readInlineTreesFrom copies the inline trees, reading memory through read. A
// tree's length is not recorded; the largest index its function's
// PCDATA_InlTreeIndex table uses gives it.
func (t *Table) readInlineTreesFrom(read func(addr uint64, n int) ([]byte, bool), gofunc uint64) {
	index := make([]inlRef, t.nfunc)
	var inl []byte
	size := t.inlSize()
	budget := maxInlineSteps
	for i := range t.nfunc {
		fn, ok := t.funcAt(i)
		if !ok {
			continue
		}
		off, ok := t.funcdata(fn, funcdataInlTree)
		if !ok {
			continue
		}
		n := t.maxValue(t.pcdata(fn, pcdataInlTreeIndex), &budget) + 1
		if n <= 0 || n > maxInlineTree {
			continue
		}
		b, ok := read(gofunc+uint64(off), int(n)*size)
		if !ok || uint64(len(inl))+uint64(len(b)) > math.MaxUint32 {
			continue
		}
		index[i] = inlRef{off: uint32(len(inl)), n: uint32(n)}
		inl = append(inl, b...)
	}
	if len(inl) > 0 {
		t.inl, t.inlIndex = inl, index
	}
}

// Lookup returns the frames at pc, an ELF virtual address, innermost first, or
// nil when no Go function holds pc.
func (t *Table) Lookup(pc uint64) []Frame {
	if t.legacy != nil {
		return t.lookupLegacy(pc)
	}
	i, ok := t.findFunc(pc)
	if !ok {
		return nil
	}
	fn, ok := t.funcAt(i)
	if !ok {
		return nil
	}
	var frames []Frame
	cur := pc
	if ref, tree, ok := t.inlineTree(i, fn); ok {
		tab := t.pcdata(fn, pcdataInlTreeIndex)
		ix, _ := t.pcvalue(tab, fn.entry, cur)
		// Each inlined call records an instruction of its caller that carries the
		// call's position; the caller's frame is read there, as runtime.CallersFrames does.
		for depth := 0; depth < maxInlineDepth; depth++ {
			call, ok := t.call(ref, tree, ix)
			if !ok || call.parentPc < 0 {
				break
			}
			file, line := t.fileLine(fn, cur)
			frames = append(frames, Frame{Function: t.funcName(call.nameOff), File: file, Line: line})
			cur = fn.entry + uint64(call.parentPc)
			ix, _ = t.pcvalue(tab, fn.entry, cur)
		}
	}
	file, line := t.fileLine(fn, cur)
	return append(frames, Frame{Function: t.funcName(fn.nameOff), File: file, Line: line})
}

func (t *Table) lookupLegacy(pc uint64) (frames []Frame) {
	// debug/gosym indexes what the tables say; hostile ones can make it panic.
	defer func() {
		if recover() != nil {
			frames = nil
		}
	}()
	file, line, fn := t.legacy.PCToLine(pc)
	if fn == nil {
		return nil
	}
	return []Frame{{Function: fn.Name, File: file, Line: int64(line)}}
}
