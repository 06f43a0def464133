package dwarf

import (
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
)

// ErrNoDWARF means the file carries no .debug_info: stripped, or never built with -g.
var ErrNoDWARF = errors.New("no dwarf debug information")

// Frame is one source-level frame at an address.
type Frame struct {
	// Name is the function as the compiler recorded it: the linkage (mangled) name
	// when there is one, else DW_AT_name. It is empty when the address has a line
	// but no function, as in assembly files.
	Name string
	// Linkage says Name is a linkage name. A plain DW_AT_name of C++ code lacks
	// namespaces and parameters, and a caller with the symbol table at hand may
	// prefer the symbol's name, as binutils does.
	Linkage bool
	// Entry is the function's (or the inlined copy's) first address.
	Entry uint64
	File  string // "" when unknown
	Line  int64  // 0 when unknown
}

const (
	// noIndex stands for an absent file or name.
	noIndex = math.MaxUint32
	// linkageBit marks a node's name index as a linkage name.
	linkageBit = 1 << 31
	// endMarker in row.file closes a line sequence: no line covers its address.
	endMarker = math.MaxUint32 - 1
	// maxRefChain bounds how many abstract-origin and specification links a name
	// lookup follows, so that a cycle in hostile input ends.
	maxRefChain = 8
	// maxOverlap bounds how far a lookup looks back among functions (or units)
	// starting before an address for one that still covers it: they do not overlap
	// in sane output, and hostile output must not make a lookup linear.
	maxOverlap = 8
)

// DefaultCacheBytes bounds the private cache of a Table loaded without one.
const DefaultCacheBytes = 8 << 20

// Options say how Load reads a file.
type Options struct {
	// MaxBytes bounds the DWARF sections read, uncompressed; 0 means no bound.
	MaxBytes int64
	// File is the whole file's contents when the caller has mapped it, else nil.
	// Uncompressed sections are then read where they lie, never copied, and
	// compressed ones are decompressed when lookups need them, until Trim. The
	// caller keeps the mapping while it uses the table and reads it under
	// mmapfile.Guard. Without File, the sections are read into memory and kept.
	File []byte
	// Release, when set, gives back the pages of File under a slice of it that were
	// read: a compressed section's pages are released as they are decompressed, so
	// that the compressed and the decompressed copy are not both resident.
	Release func([]byte)
	// Cache keeps the units lookups decode, bounded in bytes and shared by the
	// tables given it; nil gives the table a cache of its own of DefaultCacheBytes.
	Cache *Cache
	// Want are the addresses the caller is about to look up: with compressed sections
	// in File, the index keeps what decoding their units needs as it passes it (see
	// Prepare), rather than decompress the sections again for them.
	Want []uint64
}

// Table maps addresses to frames. Load indexes the units by address; a lookup
// decodes the unit covering its address (line rows, functions, inlined calls) into
// the cache, where later lookups find it until it is evicted. A Table is safe for
// concurrent lookups.
type Table struct {
	order   binary.ByteOrder
	units   []unit
	spans   []unitSpan // by lo
	cache   *Cache
	held    int64 // bytes of sections read into memory for good
	release func([]byte)

	mu     sync.Mutex // serializes decoding, which reads and may decompress secs
	secs   [numSections]section
	failed map[uint32]bool // units whose decoding failed
	closed bool
	reads  atomic.Uint64 // units decoded: lookups that read the sections

	decoded map[uint32]*cached // this table's units in the cache; the cache's lock guards it
	// scratchUsed orders the tables holding decompressed copies by their last use; the
	// cache's lock guards it.
	scratchUsed uint64
	// want are the units covering the addresses of Options.Want: the index pins what
	// decoding them needs. hold makes every block of the compressed sections stay once
	// decompressed, until Trim.
	want    map[uint32]bool
	pending []uint64 // Options.Want, until the index resolves them to units
	hold    bool
}

// unitSpan is a range of addresses and the unit whose code lies there.
type unitSpan struct {
	lo, hi uint64
	unit   uint32
}

// section is one DWARF section of a file.
type section struct {
	data []byte // the contents: mapped, read into memory, or decompressed from packed
	// packed is the compressed contents in the mapped file, when data is a
	// decompressed copy that Trim lets go of. The copy lies in scratch, anonymous
	// memory outside the Go heap: it goes back to the system when dropped, rather
	// than at the collection after, and the collector does not pace on it.
	packed  []byte
	scratch *mmapfile.Region
	comp    compression
	size    uint64 // uncompressed
	name    string
	// lazy, for .debug_info, .debug_abbrev and .debug_line compressed in a mapped
	// file, decompresses the parts decoding reaches (lazy.go); data and scratch
	// stay nil.
	lazy *lazySection
	// passed is where a walk through the section, uncompressed in a mapped file, gave
	// back the pages before (slide).
	passed uint64
}

// drop lets go of a decompressed copy.
func (sec *section) drop() {
	if sec.packed == nil {
		return
	}
	sec.scratch.Close()
	sec.scratch, sec.data = nil, nil
}

type compression uint8

const (
	compNone compression = iota
	compZlib
	compZstd
)

// HasDWARF reports whether f carries debug information this package can read.
func HasDWARF(f *elf.File) bool {
	s := elfSection(f, "info")
	return s != nil && s.Type != elf.SHT_NOBITS && s.Size > 0
}

func elfSection(f *elf.File, name string) *elf.Section {
	if s := f.Section(".debug_" + name); s != nil {
		return s
	}
	return f.Section(".zdebug_" + name)
}

// Load indexes the DWARF of f: the units and the addresses each covers, from
// .debug_aranges where it lists a unit, else from the unit's own ranges, else from
// its functions and lines, decoded once. It reads the sections a lookup needs
// (location lists, frame tables, macros and type units are left unread) and checks
// what every lookup would trip over: unit headers, unit DIEs, line program headers.
// The sections of relocatable objects (ET_REL) are used as they are, without
// applying relocations: sonde reads executables and shared libraries.
func Load(f *elf.File, o Options) (t *Table, err error) {
	var tab *Table
	// debug/elf trusts lengths and offsets in the input; a hostile file has made it
	// panic before, and must cost an error, not the agent.
	defer func() {
		if p := recover(); p != nil {
			t, err = nil, recovered(p)
		}
		if err != nil && tab != nil { // the copies decompressed so far
			tab.dropScratch()
		}
	}()
	if !HasDWARF(f) {
		return nil, ErrNoDWARF
	}
	t = &Table{cache: o.Cache, release: o.Release}
	tab = t
	if t.cache == nil {
		t.cache = NewCache(DefaultCacheBytes)
	}
	var total, packed int64 // packed: what the compressed sections inflate to
	for i, name := range sectionNames {
		s := elfSection(f, name)
		if s == nil || s.Type == elf.SHT_NOBITS {
			continue
		}
		fits := func(size uint64) error {
			if int64(size) < 0 || (o.MaxBytes > 0 && total+int64(size) > o.MaxBytes) {
				return fmt.Errorf("dwarf sections exceed %d bytes at %s (%d bytes)", o.MaxBytes, s.Name, size)
			}
			return nil
		}
		sec, err := openSection(f, s, o.File, fits)
		if err != nil {
			return nil, err
		}
		total += int64(sec.size)
		if sec.packed == nil && o.File == nil {
			t.held += int64(len(sec.data))
		}
		if sec.packed != nil {
			packed += int64(sec.size)
			if i == int(secInfo) || i == int(secAbbrev) || i == int(secLine) {
				sec.lazy = newLazy(sec.packed, sec.comp, sec.size, o.Release, i == int(secAbbrev) && sec.size > markEvery)
			}
		}
		t.secs[i] = sec
	}
	if err := t.cache.admit(packed); err != nil {
		return nil, err
	}
	t.wantAddrs(o.Want)
	if err := t.index(); err != nil {
		return nil, err
	}
	return t, nil
}

// index reads the unit headers and builds the index of t's sections.
func (t *Table) index() (err error) {
	// Decoding the units runs debug/dwarf's line reader, which some corrupt line headers
	// still make panic; Load recovers too, but the index is the part that reads them.
	defer func() {
		if p := recover(); p != nil {
			err = recovered(p)
		}
	}()
	s, err := t.sections()
	if err != nil {
		return err
	}
	if err := s.need(secInfo, 0, 16); err != nil {
		return err
	}
	if t.order, err = byteOrder(s.data[secInfo]); err != nil {
		return fmt.Errorf("parse dwarf: %w", err)
	}
	s.order = t.order
	if t.units, t.spans, err = buildIndex(s); err != nil {
		return fmt.Errorf("parse dwarf: %w", err)
	}
	// What the index read of the compressed sections goes, but for the units wanted.
	t.thin(false)
	return nil
}

// recovered turns a panic of hostile input into an error; a fault reading a mapping
// stays a fault, for the caller to drop the file.
func recovered(p any) error {
	if fe := mmapfile.Fault(p); fe != nil {
		return fe
	}
	return fmt.Errorf("corrupt dwarf: %v", p)
}

// openSection finds where s's contents are: in the mapped file, in place when
// uncompressed; or read into memory without a mapping, as debug/elf decompresses it.
// fits vets the uncompressed size before anything of that size is read.
func openSection(f *elf.File, s *elf.Section, file []byte, fits func(size uint64) error) (section, error) {
	sec := section{name: s.Name}
	gnu := strings.HasPrefix(s.Name, ".zdebug_")
	if file == nil {
		r := s.Open() // learns the uncompressed size of a .zdebug section
		sec.size = s.Size
		if err := fits(sec.size); err != nil {
			return sec, err
		}
		// Without a bound the size a header claims must not be allocated: grow with
		// what the section yields.
		var buf bytes.Buffer
		if _, err := buf.ReadFrom(io.LimitReader(r, int64(sec.size))); err != nil {
			return sec, fmt.Errorf("read %s: %w", s.Name, err)
		}
		if uint64(buf.Len()) != sec.size {
			return sec, fmt.Errorf("read %s: %d of %d bytes", s.Name, buf.Len(), sec.size)
		}
		sec.data = buf.Bytes()
		if sec.data == nil {
			sec.data = []byte{}
		}
		return sec, nil
	}
	if s.Offset > uint64(len(file)) || uint64(len(file))-s.Offset < s.FileSize {
		return sec, fmt.Errorf("%s at %#x+%#x is past the end of the file (%#x bytes)", s.Name, s.Offset, s.FileSize, len(file))
	}
	raw := file[s.Offset : s.Offset+s.FileSize : s.Offset+s.FileSize]
	switch {
	case s.Flags&elf.SHF_COMPRESSED != 0:
		// Elf32_Chdr or Elf64_Chdr: type, (reserved,) uncompressed size, alignment.
		var typ uint32
		var hdr int
		if f.Class == elf.ELFCLASS64 {
			if len(raw) < 24 {
				return sec, fmt.Errorf("%s: compression header truncated", s.Name)
			}
			typ, sec.size, hdr = f.ByteOrder.Uint32(raw), f.ByteOrder.Uint64(raw[8:]), 24
		} else {
			if len(raw) < 12 {
				return sec, fmt.Errorf("%s: compression header truncated", s.Name)
			}
			typ, sec.size, hdr = f.ByteOrder.Uint32(raw), uint64(f.ByteOrder.Uint32(raw[4:])), 12
		}
		switch elf.CompressionType(typ) {
		case elf.COMPRESS_ZLIB:
			sec.comp = compZlib
		case elf.COMPRESS_ZSTD:
			sec.comp = compZstd
		default:
			return sec, fmt.Errorf("%s: unknown compression type %d", s.Name, typ)
		}
		sec.packed = raw[hdr:]
	case gnu && len(raw) >= 12 && string(raw[:4]) == "ZLIB":
		sec.comp, sec.size, sec.packed = compZlib, binary.BigEndian.Uint64(raw[4:]), raw[12:]
	default:
		sec.data, sec.size = raw, uint64(len(raw))
	}
	return sec, fits(sec.size)
}

// sections returns the contents of every section, decompressing those that are
// not at hand. The caller holds t.mu or owns t.
func (t *Table) sections() (*sections, error) {
	s := &sections{order: t.order, t: t}
	var need int64
	for i := range t.secs {
		if sec := &t.secs[i]; sec.data == nil && sec.packed != nil && sec.lazy == nil {
			need += int64(sec.size)
		}
	}
	if need > 0 {
		t.cache.reserve(t, need)
	} else if t.holdsScratch() {
		t.cache.touch(t)
	}
	for i := range t.secs {
		sec := &t.secs[i]
		if sec.lazy != nil {
			b, err := sec.lazy.bytes()
			if err != nil {
				t.cache.unreserve(need)
				t.dropScratch()
				return nil, fmt.Errorf("read %s: %w", sec.name, err)
			}
			s.data[i] = b
			continue
		}
		if sec.data == nil && sec.packed != nil {
			scratch, err := decompress(sec.packed, sec.comp, sec.size, t.release)
			if err != nil {
				t.cache.unreserve(need) // what this call reserved and did not fill
				t.dropScratch()
				return nil, fmt.Errorf("read %s: %w", sec.name, err)
			}
			need -= int64(sec.size)
			sec.scratch, sec.data = scratch, scratch.Bytes()
			if sec.data == nil {
				sec.data = []byte{} // present, if empty
			}
		}
		s.data[i] = sec.data
	}
	return s, nil
}

// holdsScratch reports whether t holds decompressed copies. The caller holds t.mu.
func (t *Table) holdsScratch() bool {
	for i := range t.secs {
		if t.secs[i].scratch != nil || t.secs[i].lazy != nil && (t.secs[i].lazy.nFilled > 0 || len(t.secs[i].lazy.marks) > 0) {
			return true
		}
	}
	return false
}

// need makes [off, end) of a section decompressed, when it is one decompressed a block
// at a time. The caller holds t.mu or owns t.
func (t *Table) need(sec sectionIndex, off, end uint64) error {
	l := t.secs[sec].lazy
	if l == nil {
		return nil
	}
	if t.hold {
		l.all = true
	}
	before := l.inflated
	kept, err := l.need(off, end)
	if kept > 0 || l.inflated > before {
		t.cache.reserveInflated(t, kept, int64(l.inflated-before))
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", t.secs[sec].name, err)
	}
	return nil
}

// pinUnit keeps what decoding unit u needs through the next thin.
func (t *Table) pinUnit(u *unit) {
	t.pin(secInfo, u.off, u.end)
	t.pin(secAbbrev, u.abbrev, u.abbrevEnd)
	if u.lineEnd > 0 {
		t.pin(secLine, u.line, u.lineEnd)
	}
}

// pin keeps [off, end) of a section decompressed a block at a time through the next thin.
func (t *Table) pin(sec sectionIndex, off, end uint64) {
	if l := t.secs[sec].lazy; l != nil {
		l.pin(off, end)
	}
}

// slide lets go of the blocks of a section wholly below off that no wanted unit
// needs, or of a section read in place, the pages below off: the index walks the
// sections in the order of the units, and keeps a window of each. The caller holds
// t.mu or owns t.
func (t *Table) slide(sec sectionIndex, off uint64) {
	s := &t.secs[sec]
	if l := s.lazy; l != nil {
		if t.hold {
			return
		}
		if freed := l.forget(off); freed > 0 {
			t.cache.release(t, freed, !t.holdsScratch())
		}
		return
	}
	// A walk through a section read in place from the mapped file gives back the pages
	// it has passed: they stay in the page cache, and a lookup maps again the few it
	// needs. The index walk reads every unit's header, DIE and line program header:
	// libpython's 8.8 MB .debug_info and 2.5 MB .debug_line were resident, 7.6 MB more,
	// until the naming pass ended.
	if s.packed == nil && t.release != nil && off <= uint64(len(s.data)) && off >= s.passed+passedStride {
		t.release(s.data[s.passed:off])
		s.passed = off
	}
}

// passedStride is how far a walk gets between two releases of the pages it passed.
const passedStride = 256 << 10

// thin lets go of the blocks decompressed a block at a time, but the pinned ones
// unless unpin. The caller holds t.mu or owns t.
func (t *Table) thin(unpin bool) {
	var freed int64
	for i := range t.secs {
		if l := t.secs[i].lazy; l != nil {
			freed += l.thin(unpin)
		}
	}
	if unpin {
		t.want = nil
	}
	if freed > 0 {
		t.cache.release(t, freed, !t.holdsScratch())
	}
}

// Thin ends a naming pass: the blocks of the compressed sections decompressed for it
// go, their units decoded and cached, unless Hold keeps them. The other sections,
// small, stay until Trim.
func (t *Table) Thin() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.hold {
		t.thin(true)
	}
}

// MarkBytes is what the table keeps to enter its compressed sections' streams again,
// however long it is idle while maxKeptMarks allows: their marks and packed chunks.
// The cache's Decompressed counts them.
func (t *Table) MarkBytes() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.markBytes()
}

// markBytes is MarkBytes for a caller that holds t.mu or owns t.
func (t *Table) markBytes() int64 {
	var n int64
	for i := range t.secs {
		if l := t.secs[i].lazy; l != nil {
			n += l.markBytes()
		}
	}
	return n
}

// LazyBytes is what the compressed sections decompressed a block at a time come to,
// whole: what Hold would keep at most.
func (t *Table) LazyBytes() uint64 {
	var n uint64
	for i := range t.secs {
		if l := t.secs[i].lazy; l != nil {
			n += l.size
		}
	}
	return n
}

// Hold keeps every block of the compressed sections once decompressed, until Trim: for
// a file whose passes keep decoding new units, one decompression serves them all.
func (t *Table) Hold() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.hold = true
}

// wantAddrs keeps the addresses a caller is about to look up for the index, which
// resolves them to units as it learns the units.
func (t *Table) wantAddrs(addrs []uint64) {
	if len(addrs) > 0 {
		t.want, t.pending = map[uint32]bool{}, addrs
	}
}

// Prepare decompresses, in one walk through each compressed section, what decoding the
// units covering addrs that the cache does not hold needs, and keeps it till Thin:
// lookups of addresses in several new units then cost one decompression, not one each.
func (t *Table) Prepare(addrs []uint64) error {
	if !t.lazySections() {
		return nil
	}
	var units []uint32
	for _, a := range addrs {
		if u, ok := t.unitAt(a); ok && t.cache.get(t, u) == nil {
			units = append(units, u)
		}
	}
	if len(units) == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	slices.Sort(units)
	units = slices.Compact(units)
	units = slices.DeleteFunc(units, func(u uint32) bool { return t.failed[u] })
	return t.prepareUnits(units)
}

// lazySections reports whether any section is decompressed a block at a time.
func (t *Table) lazySections() bool {
	for i := range t.secs {
		if t.secs[i].lazy != nil {
			return true
		}
	}
	return false
}

// prepareUnits fills and pins what decoding units needs, section by section in
// the order of the offsets. The caller holds t.mu.
func (t *Table) prepareUnits(units []uint32) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = recovered(p)
		}
	}()
	type span struct{ off, end uint64 }
	var info, abbrev, line []span
	for _, i := range units {
		u := &t.units[i]
		info = append(info, span{u.off, u.end})
		abbrev = append(abbrev, span{u.abbrev, u.abbrevEnd})
		if u.lineEnd > 0 {
			line = append(line, span{u.line, u.lineEnd})
		}
	}
	for _, sec := range []struct {
		idx   sectionIndex
		spans []span
	}{{secInfo, info}, {secAbbrev, abbrev}, {secLine, line}} {
		slices.SortFunc(sec.spans, func(a, b span) int { return cmp.Compare(a.off, b.off) })
		for _, sp := range sec.spans {
			t.pin(sec.idx, sp.off, sp.end)
			if err := t.need(sec.idx, sp.off, sp.end); err != nil {
				return err
			}
		}
	}
	return nil
}

// decompress inflates a compressed section of size bytes into anonymous memory.
// A header may claim any size: the memory is reserved, not committed, and only
// the pages the stream really fills cost anything.
func decompress(packed []byte, comp compression, size uint64, release func([]byte)) (_ *mmapfile.Region, err error) {
	r, closer, err := openStream(packed, comp, size, release)
	if err != nil {
		return nil, err
	}
	defer closer()
	if size > math.MaxInt {
		return nil, fmt.Errorf("size %d", size)
	}
	scratch, err := mmapfile.Anon(int(size))
	if err != nil {
		return nil, err
	}
	n, err := io.ReadFull(r, scratch.Bytes())
	if err != nil {
		scratch.Close()
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			err = fmt.Errorf("%d of %d bytes", n, size)
		}
		return nil, err
	}
	return scratch, nil
}

// releasingReader reads b, giving back the pages it has read every releaseStride bytes.
type releasingReader struct {
	b        []byte
	pos      int
	released int
	release  func([]byte)
}

const releaseStride = 256 << 10

func (r *releasingReader) Read(p []byte) (int, error) {
	if r.pos >= len(r.b) {
		r.giveBack()
		return 0, io.EOF
	}
	n := copy(p, r.b[r.pos:])
	r.pos += n
	if r.pos-r.released >= releaseStride {
		r.giveBack()
	}
	return n, nil
}

func (r *releasingReader) giveBack() {
	if r.pos > r.released {
		r.release(r.b[r.released:r.pos])
		r.released = r.pos
	}
}

// Trim lets go of the decompressed copies of compressed sections; the next lookup
// that decodes a unit decompresses them again, entering a zlib stream at the mark
// before its unit where the marks were few enough to keep (maxKeptMarks).
// Uncompressed sections stay where they are, in the mapping.
func (t *Table) Trim() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropScratchKeeping(true)
}

// Close drops the table's units from the cache and its sections. The table must
// not be used afterwards; the caller may then unmap the file.
func (t *Table) Close() {
	t.cache.dropTable(t)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	t.dropScratch()
	t.secs = [numSections]section{}
}

// Lookup returns the frames at addr, innermost first, or nil when the debug
// information covers addr with neither a line nor a function. The error says why
// the unit covering addr could not be decoded, the first time only; it is a
// *mmapfile.FaultError when reading the mapped file faulted.
func (t *Table) Lookup(addr uint64) (frames []Frame, err error) {
	u, ok := t.unitAt(addr)
	if !ok {
		return nil, nil
	}
	ut, err := t.unit(u)
	if ut == nil {
		return nil, err
	}
	return ut.lookup(addr), nil
}

// SectionReads counts the lookups that read the sections, decoding a unit the cache
// did not hold; the others need no section, decompressed or not.
func (t *Table) SectionReads() uint64 { return t.reads.Load() }

// unitAt returns the unit whose code lies at addr: of the spans holding addr, the
// one starting last.
func (t *Table) unitAt(addr uint64) (uint32, bool) {
	i, _ := slices.BinarySearchFunc(t.spans, addr, func(s unitSpan, a uint64) int {
		if s.lo <= a {
			return -1
		}
		return 1
	})
	for j := i - 1; j >= 0 && j >= i-maxOverlap; j-- {
		if s := t.spans[j]; addr >= s.lo && addr < s.hi {
			return s.unit, true
		}
	}
	return 0, false
}

// unit returns unit u decoded, from the cache or decoding it.
func (t *Table) unit(u uint32) (*unitTable, error) {
	if ut := t.cache.get(t, u); ut != nil {
		return ut, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.failed[u] {
		return nil, nil
	}
	t.reads.Add(1)
	ut, err := t.decode(u)
	if err != nil {
		if errors.Is(err, mmapfile.ErrFault) {
			return nil, err
		}
		if t.failed == nil {
			t.failed = map[uint32]bool{}
		}
		t.failed[u] = true
		return nil, fmt.Errorf("dwarf unit at %#x: %w", t.units[u].off, err)
	}
	t.cache.add(t, u, ut)
	t.giveBackRead()
	return ut, nil
}

// giveBackRead gives back the pages of the sections read in place, once a unit is
// decoded: the unit keeps copies of what it uses, and the pages stay in the page cache
// for the next decoding to map again. Naming five addresses of pyenv's libpython (its
// DWARF uncompressed, 8.8 MB of .debug_info) held 4.3 MB of the file resident at once,
// the units decoded and the DIEs and strings they led to, until the pass ended. The
// caller holds t.mu.
func (t *Table) giveBackRead() {
	if t.release == nil {
		return
	}
	for i := range t.secs {
		if s := &t.secs[i]; s.packed == nil && s.lazy == nil && len(s.data) > 0 {
			t.release(s.data) // a section read into memory is not the mapping's: left alone
		}
	}
}

func (t *Table) decode(u uint32) (ut *unitTable, err error) {
	defer func() {
		if p := recover(); p != nil {
			ut, err = nil, recovered(p)
		}
	}()
	s, err := t.sections()
	if err != nil {
		return nil, err
	}
	return decodeUnit(s, t.units, int(u))
}

// Units is the number of units the table indexes.
func (t *Table) Units() int { return len(t.units) }

// SizeBytes estimates the memory the table holds of its own: the index, and
// sections read into memory for good. Decoded units are the cache's, and
// decompressed sections are held only until Trim.
func (t *Table) SizeBytes() int64 {
	return int64(unsafe.Sizeof(Table{})) +
		int64(cap(t.units))*int64(unsafe.Sizeof(unit{})) +
		int64(cap(t.spans))*int64(unsafe.Sizeof(unitSpan{})) +
		t.held
}
