package symbolize

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"unsafe"

	"github.com/klauspost/compress/s2"
	"github.com/sonde-profiler/sonde/internal/mmapfile"
)

// ErrKernelAddressesHidden means kallsyms lists every address as zero, which the kernel
// does for readers it does not trust with kernel pointers (kernel.kptr_restrict).
var ErrKernelAddressesHidden = errors.New("kernel symbol addresses are hidden: run as root, or set sysctl kernel.kptr_restrict=0")

// maxTrailingExtent bounds the last symbol of the kernel or of a module. Kallsyms has
// no sizes, so such a symbol would otherwise swallow every address up to the next
// module, including code of modules loaded after the table was read: those must miss,
// so that the miss triggers a reload instead of a wrong name.
const maxTrailingExtent = 64 << 10

// KernelSymbols are the kernel's and its modules' text symbols, as kallsyms lists them.
//
// A symbol covers the addresses up to the next one; the last of the kernel or of a
// module covers at most 64 KiB, so that code loaded after kallsyms was read misses.
// Several names at one address leave one, as in SymbolTable: global (T) before weak
// (W, w) before local (t), then the shorter, then the smaller name.
//
// The table is compact: addresses as 32-bit offsets from the lowest where the span
// allows (it does on x86-64 and arm64, kernel, modules and BPF programs within 4
// GiB), modules as runs, and names in blocks of kallsymsBlock compressed with S2,
// one block decoded per lookup (a microsecond or two). A kernel's 120 000 symbols
// take 1.6 MiB instead of the 4.7 the plain table took, outside the Go heap. It is
// immutable, and safe for concurrent lookups.
type KernelSymbols struct {
	n      int
	base   uint64
	addr32 []uint32 // addresses less base, when they all fit
	addr64 []uint64 // else the addresses
	// blocks[i] is where the names of symbols i*kallsymsBlock… start in names: S2
	// blocks of uvarint-prefixed names.
	blocks  []uint32
	names   []byte
	runs    []moduleRun // by first symbol
	modules []string    // modules[0] is "" for the kernel itself
	// mem holds the arrays above, but runs and modules, outside the Go heap; nil
	// where the heap does.
	mem *mmapfile.Region
}

// moduleRun says the symbols from start on, up to the next run, are module's.
type moduleRun struct {
	start  uint32
	module uint16
}

// kallsymsBlock is how many names share a compressed block: larger blocks compress
// better (64 names take 36 % of their bytes, 32 take 39 %) and cost more per lookup.
const kallsymsBlock = 64

// maxKernelName bounds a name; KSYM_NAME_LEN is 512, and longer lines are not kallsyms.
const maxKernelName = 1<<14 - 1

// KernelSymbol is a kernel function.
type KernelSymbol struct {
	Name   string
	Module string // "" for the kernel itself, else e.g. "ext4"
	Addr   uint64
}

// LoadKallsyms reads kernel symbols from a file in /proc/kallsyms format.
func LoadKallsyms(path string) (*KernelSymbols, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ks, err := ParseKallsyms(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return ks, nil
}

// ksym is a text symbol while parsing: 16 bytes, no pointers.
type ksym struct {
	addr    uint64
	nameOff uint32 // into the parse's name chunks, as chunk<<chunkBits | offset
	// nameLen holds the length in its low 14 bits and the binding's rank (see
	// bindingRank) in the top 2, so that sorting moves one 16-byte element.
	nameLen uint16
	module  uint16
}

func (s ksym) len() uint32 { return uint32(s.nameLen & maxKernelName) }
func (s ksym) rank() int   { return int(s.nameLen >> 14) }

// Names are gathered in chunks that are never reallocated: a kernel's 3 MB of
// names cost 3 MB, not the 8 a doubling buffer allocates on its way.
const (
	chunkBits  = 18
	chunkBytes = 1 << chunkBits
	symChunk   = 8192 // symbols per chunk, likewise
)

type kallsymsParse struct {
	syms      [][]ksym
	symMem    []*mmapfile.Region // syms' chunks where anonymous memory holds them
	n         int
	names     [][]byte
	nameBytes int
	scratch   scratch
}

// scratch hands out the parse's buffers from anonymous memory, which goes back to
// the system when the parse ends rather than at a later collection: a reread of
// kallsyms then leaves no garbage for the collector to pace on. Where anonymous
// memory cannot be had, the heap serves.
type scratch struct {
	regions []*mmapfile.Region
}

func (sc *scratch) bytes(n int) []byte {
	b, _ := sc.alloc(n)
	return b
}

// alloc is bytes, and says which anonymous memory holds them (nil: the heap), so that
// it can go before the parse ends.
func (sc *scratch) alloc(n int) ([]byte, *mmapfile.Region) {
	if r, err := mmapfile.Anon(n); err == nil && n > 0 {
		sc.regions = append(sc.regions, r)
		return r.Bytes()[:0:n], r
	}
	return make([]byte, 0, n), nil
}

// syms returns room for n symbols, and the anonymous memory holding it if any; ksym
// holds no pointers, so that memory the collector does not know is fine for it.
func (sc *scratch) syms(n int) ([]ksym, *mmapfile.Region) {
	b, r := sc.alloc(n * int(unsafe.Sizeof(ksym{})))
	return unsafe.Slice((*ksym)(unsafe.Pointer(unsafe.SliceData(b))), n)[:0], r
}

func (sc *scratch) release() {
	for _, r := range sc.regions {
		r.Close()
	}
	sc.regions = nil
}

func (p *kallsymsParse) add(addr uint64, rank uint8, module uint16, name []byte) error {
	last := len(p.names) - 1
	if last < 0 || len(p.names[last])+len(name) > chunkBytes {
		if len(p.names) >= 1<<(32-chunkBits) {
			return errors.New("kernel symbol names exceed 4 GiB")
		}
		p.names = append(p.names, p.scratch.bytes(chunkBytes))
		last++
	}
	off := uint32(last)<<chunkBits | uint32(len(p.names[last]))
	p.names[last] = append(p.names[last], name...)
	if p.n%symChunk == 0 {
		c, r := p.scratch.syms(symChunk)
		p.syms = append(p.syms, c)
		p.symMem = append(p.symMem, r)
	}
	c := len(p.syms) - 1
	p.syms[c] = append(p.syms[c], ksym{addr: addr, nameOff: off, nameLen: uint16(len(name)) | uint16(rank)<<14, module: module})
	p.n++
	p.nameBytes += len(name)
	return nil
}

func (p *kallsymsParse) name(s ksym) []byte {
	c := p.names[s.nameOff>>chunkBits]
	off := s.nameOff & (chunkBytes - 1)
	return c[off : off+s.len()]
}

// ParseKallsyms reads kernel symbols in /proc/kallsyms format, keeping text symbols.
// It returns ErrKernelAddressesHidden when every address is zero.
func ParseKallsyms(r io.Reader) (*KernelSymbols, error) {
	var p kallsymsParse
	defer p.scratch.release()
	var (
		modules  = []string{""}
		moduleOf = map[string]uint16{"": 0}
		nonZero  bool
		lines    int
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		lines++
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		// "ffffffff81000000 T _stext" or "ffffffffc0a1b000 t foo\t[ext4]"
		addrField, rest, ok := bytes.Cut(line, []byte{' '})
		if !ok || len(rest) < 3 || rest[1] != ' ' {
			return nil, fmt.Errorf("line %d: malformed: %q", lines, line)
		}
		addr, ok := parseHex(addrField)
		if !ok {
			return nil, fmt.Errorf("line %d: address %q", lines, addrField)
		}
		nonZero = nonZero || addr != 0
		var rank uint8
		switch rest[0] {
		case 'T':
			rank = 0
		case 'W', 'w':
			rank = 1
		case 't':
			rank = 2
		default:
			continue
		}
		name, mod, _ := bytes.Cut(rest[2:], []byte{'\t'})
		if len(name) == 0 || len(name) > maxKernelName {
			return nil, fmt.Errorf("line %d: malformed name: %q", lines, line)
		}
		var modIdx uint16
		if len(mod) > 0 {
			m := bytes.TrimSuffix(bytes.TrimPrefix(mod, []byte{'['}), []byte{']'})
			idx, seen := moduleOf[string(m)]
			if !seen {
				if len(modules) > math.MaxUint16 {
					return nil, fmt.Errorf("line %d: more than %d modules", lines, math.MaxUint16)
				}
				idx = uint16(len(modules))
				modules = append(modules, string(m))
				moduleOf[modules[idx]] = idx
			}
			modIdx = idx
		}
		if err := p.add(addr, rank, modIdx, name); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if lines > 0 && !nonZero {
		return nil, ErrKernelAddressesHidden
	}
	if p.n == 0 {
		return nil, errors.New("no kernel text symbols")
	}
	return p.build(modules), nil
}

// parseHex parses a hexadecimal address of up to 16 digits.
func parseHex(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 16 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | uint64(c)
	}
	return v, true
}

// build sorts the symbols, keeps the preferred name at each address and packs the
// table.
func (p *kallsymsParse) build(modules []string) *KernelSymbols {
	syms, _ := p.scratch.syms(p.n)
	for i, c := range p.syms {
		syms = append(syms, c...)
		// Each chunk goes as soon as it is copied: the parse's peak holds the symbols
		// once, not twice (this machine's kernel: the parse's peak 8.7 → 6.9 MB).
		if r := p.symMem[i]; r != nil {
			p.syms[i] = nil
			r.Close()
		}
	}
	p.syms, p.symMem = nil, nil
	slices.SortFunc(syms, func(a, b ksym) int {
		if c := cmp.Compare(a.addr, b.addr); c != 0 {
			return c
		}
		// Aliases only. The same name in two modules ties: the earlier line wins, so
		// that the table does not depend on how the sort met them (names are stored
		// in line order).
		if c := preferAliasBytes(a.rank(), b.rank(), p.name(a), p.name(b)); c != 0 {
			return c
		}
		return cmp.Compare(a.nameOff, b.nameOff)
	})
	kept := 0
	for i, s := range syms {
		if i == 0 || s.addr != syms[i-1].addr {
			kept++
		}
	}

	ks := &KernelSymbols{n: kept, modules: modules}
	lo, hi := syms[0].addr, syms[len(syms)-1].addr
	ks.base = lo
	if hi-lo <= math.MaxUint32 {
		ks.addr32 = make([]uint32, 0, kept)
	} else {
		ks.addr64 = make([]uint64, 0, kept)
	}
	ks.blocks = make([]uint32, 0, (kept+kallsymsBlock-1)/kallsymsBlock)
	// About 36 % of the names' bytes once compressed; the buffer grows if not.
	out := make([]byte, 0, p.nameBytes*2/5+64<<10)
	var raw []byte
	flush := func() {
		if len(raw) == 0 {
			return
		}
		ks.blocks = append(ks.blocks, uint32(len(out)))
		need := s2.MaxEncodedLen(len(raw))
		if cap(out)-len(out) < need {
			out = slices.Grow(out, need)
		}
		enc := s2.EncodeBetter(out[len(out):len(out)+need], raw)
		out = out[:len(out)+len(enc)]
		raw = raw[:0]
	}
	n := 0
	for i, s := range syms {
		if i > 0 && s.addr == syms[i-1].addr {
			continue
		}
		if ks.addr32 != nil {
			ks.addr32 = append(ks.addr32, uint32(s.addr-lo))
		} else {
			ks.addr64 = append(ks.addr64, s.addr)
		}
		if len(ks.runs) == 0 || ks.runs[len(ks.runs)-1].module != s.module {
			ks.runs = append(ks.runs, moduleRun{start: uint32(n), module: s.module})
		}
		raw = binary.AppendUvarint(raw, uint64(s.len()))
		raw = append(raw, p.name(s)...)
		n++
		if n%kallsymsBlock == 0 {
			flush()
		}
	}
	flush()
	ks.names = slices.Clip(out)
	if cap(out)-len(out) > len(out)/8 {
		ks.names = slices.Clone(out) // the estimate left much room: give it back
	}
	ks.runs = slices.Clip(ks.runs)
	ks.offHeap()
	return ks
}

// offHeap moves the table's arrays, which hold no pointers, into anonymous memory
// that goes when the table does. On the Go heap they were a third of sonde's live
// heap on a quiet host, and with GOGC at 50 every byte of live heap holds another
// half byte of room to the next collection: 1.6 MiB of kernel symbols cost 2.4. Where
// anonymous memory cannot be had, the heap keeps them.
func (k *KernelSymbols) offHeap() {
	n := 4*len(k.addr32) + 8*len(k.addr64) + 4*len(k.blocks) + len(k.names)
	if n == 0 {
		return
	}
	r, err := mmapfile.Anon(n)
	if err != nil {
		return
	}
	b := r.Bytes()
	// The 64-bit addresses first: an anonymous mapping is page aligned, so each array
	// starts aligned for its elements.
	k.addr64 = moveInto(&b, k.addr64)
	k.addr32 = moveInto(&b, k.addr32)
	k.blocks = moveInto(&b, k.blocks)
	k.names = moveInto(&b, k.names)
	k.mem = r // unmapped by its own backstop once the table is unreachable
}

// moveInto copies s to the front of *b, advances *b past it and returns the copy.
func moveInto[T uint32 | uint64 | byte](b *[]byte, s []T) []T {
	if s == nil {
		return nil
	}
	size := len(s) * int(unsafe.Sizeof(s[0]))
	dst := unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(*b))), len(s))
	copy(dst, s)
	*b = (*b)[size:]
	return dst
}

// preferAliasBytes is preferAlias for names as bytes.
func preferAliasBytes(rankA, rankB int, a, b []byte) int {
	if c := cmp.Compare(rankA, rankB); c != 0 {
		return c
	}
	if c := cmp.Compare(len(a), len(b)); c != 0 {
		return c
	}
	return bytes.Compare(a, b)
}

// Len is the number of symbols kept, after merging aliases.
func (k *KernelSymbols) Len() int { return k.n }

// SizeBytes is the memory the table holds.
func (k *KernelSymbols) SizeBytes() int64 {
	n := int64(cap(k.addr32))*4 + int64(cap(k.addr64))*8 + int64(cap(k.blocks))*4 + int64(cap(k.names)) +
		int64(cap(k.runs))*int64(unsafe.Sizeof(moduleRun{}))
	for _, m := range k.modules {
		n += 16 + int64(len(m))
	}
	return n
}

func (k *KernelSymbols) addr(i int) uint64 {
	if k.addr32 != nil {
		return k.base + uint64(k.addr32[i])
	}
	return k.addr64[i]
}

// module returns the module index of symbol i.
func (k *KernelSymbols) module(i int) uint16 {
	r, _ := slices.BinarySearchFunc(k.runs, uint32(i), func(r moduleRun, i uint32) int {
		if r.start <= i {
			return -1
		}
		return 1
	})
	return k.runs[r-1].module
}

// name decodes the name of symbol i from its block.
func (k *KernelSymbols) name(i int) string {
	b := i / kallsymsBlock
	end := uint32(len(k.names))
	if b+1 < len(k.blocks) {
		end = k.blocks[b+1]
	}
	var buf [2048]byte
	raw, err := s2.Decode(buf[:], k.names[k.blocks[b]:end])
	if err != nil {
		return "" // the table made the block: it decodes
	}
	for j := i % kallsymsBlock; ; j-- {
		n, w := binary.Uvarint(raw)
		if w <= 0 || n > uint64(len(raw)-w) {
			return ""
		}
		if j == 0 {
			return string(raw[w : w+int(n)])
		}
		raw = raw[w+int(n):]
	}
}

// Lookup returns the kernel function enclosing addr.
func (k *KernelSymbols) Lookup(addr uint64) (KernelSymbol, bool) {
	// The last symbol at or below addr.
	lo, hi := 0, k.n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if k.addr(m) <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	i := lo - 1
	if i < 0 {
		return KernelSymbol{}, false
	}
	start := k.addr(i)
	mod := k.module(i)
	end := start + maxTrailingExtent
	if end < start { // near the top of the address space
		end = math.MaxUint64
	}
	if i+1 < k.n {
		if next := k.addr(i + 1); k.module(i+1) == mod || next < end {
			end = next
		}
	}
	if addr >= end {
		return KernelSymbol{}, false
	}
	return KernelSymbol{Name: k.name(i), Module: k.modules[mod], Addr: start}, true
}
