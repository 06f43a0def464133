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
	// names holds every kept name back to back; entries point into it, so that a
	// table costs one allocation for its names rather than one per symbol.
	names string
}

type tableEntry struct {
	addr, end uint64 // end is exclusive and already resolves unsized symbols
	nameOff   uint32
	// nameLen holds the name's length in its low 27 bits, then whether it came from
	// .dynsym, then the binding in the top 4.
	nameLen uint32
}

const (
	nameLenBits = 27
	maxNameLen  = 1<<nameLenBits - 1
	dynamicBit  = 1 << nameLenBits
	bindingBits = nameLenBits + 1
)

// candidate is a symbol offered to a table, with the address an unsized symbol must
// not extend past (the end of its section).
type candidate struct {
	Symbol
	limit uint64
}

// NewSymbolTable builds a table from symbols in any order. Unsized symbols extend
// to the next symbol, or without bound for the last one.
func NewSymbolTable(syms []Symbol) *SymbolTable {
	cands := make([]candidate, len(syms))
	for i, s := range syms {
		cands[i] = candidate{Symbol: s, limit: math.MaxUint64}
	}
	return newSymbolTable(cands)
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

// newSymbolTable sorts cands in place and builds the table from them.
func newSymbolTable(cands []candidate) *SymbolTable {
	slices.SortFunc(cands, func(a, b candidate) int {
		if c := cmp.Compare(a.Value, b.Value); c != 0 {
			return c
		}
		if c := preferAlias(bindingRank(a.Binding), bindingRank(b.Binding), a.Name, b.Name); c != 0 {
			return c
		}
		return cmpBool(a.Dynamic, b.Dynamic) // .symtab first
	})

	// Count what the aliases leave, to allocate once.
	n, blob := 0, 0
	for i, c := range cands {
		if i == 0 || c.Value != cands[i-1].Value {
			n++
			blob += min(len(c.Name), maxNameLen)
		}
	}
	t := &SymbolTable{entries: make([]tableEntry, 0, n)}
	var names strings.Builder
	names.Grow(blob)
	for i := 0; i < len(cands); {
		first := cands[i]
		size, limit := first.Size, first.limit
		j := i + 1
		for ; j < len(cands) && cands[j].Value == first.Value; j++ {
			size = max(size, cands[j].Size)
			limit = max(limit, cands[j].limit)
		}
		var end uint64
		switch {
		case size > 0:
			end = first.Value + size
			if end < first.Value { // a corrupt size must not wrap around
				end = math.MaxUint64
			}
		case j < len(cands):
			end = min(limit, cands[j].Value)
		default:
			end = limit
		}
		name := first.Name[:min(len(first.Name), maxNameLen)]
		if names.Len() > math.MaxUint32-len(name) {
			break // over 4 GiB of names cannot come from a real file; keep what fits
		}
		nameLen := uint32(len(name)) | uint32(first.Binding&0xf)<<bindingBits
		if first.Dynamic {
			nameLen |= dynamicBit
		}
		t.entries = append(t.entries, tableEntry{
			addr:    first.Value,
			end:     end,
			nameOff: uint32(names.Len()),
			nameLen: nameLen,
		})
		names.WriteString(name)
		i = j
	}
	t.names = names.String()
	return t
}

// sizeBytes estimates the memory the table holds.
func (t *SymbolTable) sizeBytes() int64 {
	return int64(cap(t.entries))*int64(unsafe.Sizeof(tableEntry{})) + int64(len(t.names))
}

// Len is the number of symbols the table kept, after merging aliases.
func (t *SymbolTable) Len() int { return len(t.entries) }

// Lookup returns the symbol enclosing addr.
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
	return Symbol{
		Name:    t.names[e.nameOff : e.nameOff+n],
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
