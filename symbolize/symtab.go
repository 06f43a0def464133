package symbolize

import (
	"cmp"
	"debug/elf"
	"math"
	"slices"
	"strings"
	"unsafe"
)

// Symbol is a named range of code.
type Symbol struct {
	Name  string
	Value uint64 // start address
	// Size is the symbol's extent in bytes. Given to NewSymbolTable, 0 means unknown;
	// returned by a lookup, it is the extent the lookup accepted (see SymbolTable).
	Size    uint64
	Binding elf.SymBind
	// Dynamic says the name came from .dynsym rather than .symtab.
	Dynamic bool
}

// SymbolTable finds the function enclosing an address.
//
// A symbol covers [Value, Value+Size). A symbol without a size covers up to the
// next symbol (and, read from ELF, not past its section), because assembly and old
// toolchains often leave sizes out; an address past the end of a sized symbol belongs
// to no symbol, because the gap there is padding or code with no symbol (PLT stubs,
// stripped statics), and naming it after its neighbour would be wrong rather than
// merely vague.
//
// Several names at one address (aliases, identical code folding) leave one of them:
// GLOBAL binding before WEAK before LOCAL and anything else, then the shorter name,
// then the lexicographically smaller. A global name is the one callers and documentation
// use, and the choice must not depend on symbol table order so that profiles of the
// same binary agree. A name both tables list counts as from .symtab. The aliases'
// largest size is kept.
type SymbolTable struct {
	entries []tableEntry // sorted by addr, one per address
	// names are the string tables entries point into: names[0] holds copies, one
	// string for all, so that a table costs one allocation for its names rather than
	// one per symbol; the others are ELF string tables used where they lie, in a
	// mapped file (see symbolReader).
	names []string
}

type tableEntry struct {
	addr, end uint64 // end is exclusive and already resolves unsized symbols
	nameOff   uint32 // into names[source]
	// nameLen holds the name's length in its low 24 bits, then the index of its
	// string table in 3, whether it came from .dynsym, and the binding in the top 4.
	nameLen uint32
}

const (
	nameLenBits = 24
	maxNameLen  = 1<<nameLenBits - 1
	sourceShift = nameLenBits
	maxSources  = 1 << 3
	dynamicBit  = 1 << (sourceShift + 3)
	bindingBits = sourceShift + 4
)

// candidate is a symbol offered to a table: its name is names[src][nameOff:][:nameLen]
// of the string tables newSymbolTable is given, and limit is the address an unsized
// symbol must not extend past (the end of its section).
type candidate struct {
	value, size, limit uint64
	nameOff, nameLen   uint32
	src                uint8
	binding            elf.SymBind
	dynamic            bool
}

// nameTable is a string table candidates name their symbols in.
type nameTable struct {
	s string
	// keep says a table may point into s rather than copy the names it keeps: s lies
	// in a mapping that lives as long as the table.
	keep bool
}

func (c *candidate) name(tabs []nameTable) string {
	return tabs[c.src].s[c.nameOff : c.nameOff+c.nameLen]
}

// NewSymbolTable builds a table from symbols in any order. Unsized symbols extend
// to the next symbol, or without bound for the last one.
func NewSymbolTable(syms []Symbol) *SymbolTable {
	n := 0
	for _, s := range syms {
		n += min(len(s.Name), maxNameLen)
	}
	var all strings.Builder
	all.Grow(n)
	cands := make([]candidate, 0, len(syms))
	for _, s := range syms {
		name := s.Name[:min(len(s.Name), maxNameLen)]
		if all.Len() > math.MaxUint32-len(name) {
			break // over 4 GiB of names; keep what fits
		}
		cands = append(cands, candidate{
			value: s.Value, size: s.Size, limit: math.MaxUint64,
			nameOff: uint32(all.Len()), nameLen: uint32(len(name)),
			binding: s.Binding, dynamic: s.Dynamic,
		})
		all.WriteString(name)
	}
	return newSymbolTable(cands, []nameTable{{s: all.String()}})
}

// bindingRank orders aliases by binding; lower wins.
func bindingRank(b elf.SymBind) int {
	switch b {
	case elf.STB_GLOBAL:
		return 0
	case elf.STB_WEAK:
		return 1
	case elf.STB_LOCAL:
		return 2
	default:
		return 3
	}
}

// preferAlias orders names for one address so that the preferred one comes first.
func preferAlias(rankA, rankB int, a, b string) int {
	if c := cmp.Compare(rankA, rankB); c != 0 {
		return c
	}
	if c := cmp.Compare(len(a), len(b)); c != 0 {
		return c
	}
	return strings.Compare(a, b)
}

// newSymbolTable sorts cands in place and builds the table from them. Names in a
// table that may be kept (keep) stay where they are; the others are copied. At most
// maxSources-1 tables may be kept.
func newSymbolTable(cands []candidate, tabs []nameTable) *SymbolTable {
	slices.SortFunc(cands, func(a, b candidate) int {
		if c := cmp.Compare(a.value, b.value); c != 0 {
			return c
		}
		if c := preferAlias(bindingRank(a.binding), bindingRank(b.binding), a.name(tabs), b.name(tabs)); c != 0 {
			return c
		}
		return cmpBool(a.dynamic, b.dynamic) // .symtab first
	})

	// Where each table's names go: kept tables become sources 1…, the rest are
	// copied into source 0.
	source := make([]uint8, len(tabs))
	t := &SymbolTable{names: []string{""}}
	for i, tab := range tabs {
		if tab.keep && len(t.names) < maxSources {
			source[i] = uint8(len(t.names))
			t.names = append(t.names, tab.s)
		}
	}
	// Count what the aliases leave, to allocate once.
	n, blob := 0, 0
	for i, c := range cands {
		if i == 0 || c.value != cands[i-1].value {
			n++
			if source[c.src] == 0 {
				blob += int(c.nameLen)
			}
		}
	}
	t.entries = make([]tableEntry, 0, n)
	var names strings.Builder
	names.Grow(blob)
	for i := 0; i < len(cands); {
		first := cands[i]
		size, limit := first.size, first.limit
		j := i + 1
		for ; j < len(cands) && cands[j].value == first.value; j++ {
			size = max(size, cands[j].size)
			limit = max(limit, cands[j].limit)
		}
		var end uint64
		switch {
		case size > 0:
			end = first.value + size
			if end < first.value { // a corrupt size must not wrap around
				end = math.MaxUint64
			}
		case j < len(cands):
			end = min(limit, cands[j].value)
		default:
			end = limit
		}
		if end <= first.value {
			// A sizeless symbol past the end of its section (a corrupt file) encloses
			// nothing: kept, it would claim a range that wraps around.
			i = j
			continue
		}
		src, off := source[first.src], first.nameOff
		if src == 0 {
			name := first.name(tabs)
			if names.Len() > math.MaxUint32-len(name) {
				break // over 4 GiB of names cannot come from a real file; keep what fits
			}
			off = uint32(names.Len())
			names.WriteString(name)
		}
		nameLen := min(first.nameLen, maxNameLen) | uint32(src)<<sourceShift | uint32(first.binding&0xf)<<bindingBits
		if first.dynamic {
			nameLen |= dynamicBit
		}
		t.entries = append(t.entries, tableEntry{addr: first.value, end: end, nameOff: off, nameLen: nameLen})
		i = j
	}
	t.names[0] = names.String()
	return t
}

// sizeBytes estimates the memory the table holds: the string tables it points into
// are mapped, not on the heap.
func (t *SymbolTable) sizeBytes() int64 {
	return int64(cap(t.entries))*int64(unsafe.Sizeof(tableEntry{})) + int64(len(t.names[0])) + int64(cap(t.names))*16
}

// Len is the number of symbols the table kept, after merging aliases.
func (t *SymbolTable) Len() int { return len(t.entries) }

// Lookup returns the symbol enclosing addr. A table built from a mapped file returns
// names that point into the mapping: they are valid while the file is, and are read
// under mmapfile.Guard.
func (t *SymbolTable) Lookup(addr uint64) (Symbol, bool) {
	// A hand-written binary search: this is the hot path and sort.Search's closure
	// call per step costs more than the comparison.
	lo, hi := 0, len(t.entries)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if t.entries[m].addr <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	i := lo - 1
	if i < 0 || addr >= t.entries[i].end {
		return Symbol{}, false
	}
	return t.symbol(i), true
}

func (t *SymbolTable) symbol(i int) Symbol {
	e := t.entries[i]
	n := e.nameLen & maxNameLen
	names := t.names[(e.nameLen>>sourceShift)&(maxSources-1)]
	return Symbol{
		Name:    names[e.nameOff : e.nameOff+n],
		Value:   e.addr,
		Size:    e.end - e.addr,
		Binding: elf.SymBind(e.nameLen >> bindingBits),
		Dynamic: e.nameLen&dynamicBit != 0,
	}
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	default:
		return 1
	}
}
