package symbolize

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
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
type KernelSymbols struct {
	entries []kernelEntry // sorted by addr, one per address
	names   string        // every kept name back to back
	modules []string      // modules[0] is "" for the kernel itself
}

type kernelEntry struct {
	addr    uint64
	nameOff uint32
	nameLen uint16 // KSYM_NAME_LEN is 512; longer lines are not kallsyms
	module  uint16
}

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

// ParseKallsyms reads kernel symbols in /proc/kallsyms format, keeping text symbols.
// It returns ErrKernelAddressesHidden when every address is zero.
func ParseKallsyms(r io.Reader) (*KernelSymbols, error) {
	// Names go into one buffer as they are read: a slice per symbol, or a string per
	// comparison while sorting, would cost millions of allocations for a kernel's 100k+.
	type ksym struct {
		addr    uint64
		nameOff uint32
		nameLen uint16
		module  uint16
		rank    int
	}
	var (
		syms     []ksym
		all      []byte
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
		addr, err := strconv.ParseUint(string(addrField), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: address: %w", lines, err)
		}
		nonZero = nonZero || addr != 0
		var rank int
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
		if len(name) == 0 || len(name) > math.MaxUint16 {
			return nil, fmt.Errorf("line %d: malformed name: %q", lines, line)
		}
		var modIdx uint16
		if len(mod) > 0 {
			m := string(bytes.TrimSuffix(bytes.TrimPrefix(mod, []byte{'['}), []byte{']'}))
			idx, seen := moduleOf[m]
			if !seen {
				if len(modules) > math.MaxUint16 {
					return nil, fmt.Errorf("line %d: more than %d modules", lines, math.MaxUint16)
				}
				idx = uint16(len(modules))
				modules = append(modules, m)
				moduleOf[m] = idx
			}
			modIdx = idx
		}
		if len(all)+len(name) > math.MaxUint32 {
			return nil, errors.New("kernel symbol names exceed 4 GiB")
		}
		syms = append(syms, ksym{addr: addr, nameOff: uint32(len(all)), nameLen: uint16(len(name)), module: modIdx, rank: rank})
		all = append(all, name...)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if lines > 0 && !nonZero {
		return nil, ErrKernelAddressesHidden
	}
	if len(syms) == 0 {
		return nil, errors.New("no kernel text symbols")
	}
	nameOf := func(s ksym) []byte { return all[s.nameOff : s.nameOff+uint32(s.nameLen)] }

	slices.SortFunc(syms, func(a, b ksym) int {
		if c := cmp.Compare(a.addr, b.addr); c != 0 {
			return c
		}
		// Aliases only: rare enough for the strings.
		return preferAlias(a.rank, b.rank, string(nameOf(a)), string(nameOf(b)))
	})
	blob := 0
	for i, s := range syms {
		if i == 0 || s.addr != syms[i-1].addr {
			blob += int(s.nameLen)
		}
	}
	ks := &KernelSymbols{modules: modules, entries: make([]kernelEntry, 0, len(syms))}
	names := make([]byte, 0, blob)
	for i, s := range syms {
		if i > 0 && s.addr == syms[i-1].addr {
			continue
		}
		ks.entries = append(ks.entries, kernelEntry{
			addr: s.addr, nameOff: uint32(len(names)), nameLen: s.nameLen, module: s.module,
		})
		names = append(names, nameOf(s)...)
	}
	ks.names = string(names)
	return ks, nil
}

// Len is the number of symbols kept, after merging aliases.
func (k *KernelSymbols) Len() int { return len(k.entries) }

// Lookup returns the kernel function enclosing addr.
func (k *KernelSymbols) Lookup(addr uint64) (KernelSymbol, bool) {
	i, ok := slices.BinarySearchFunc(k.entries, addr, func(e kernelEntry, a uint64) int {
		return cmp.Compare(e.addr, a)
	})
	if !ok {
		i-- // the last entry below addr
	}
	if i < 0 {
		return KernelSymbol{}, false
	}
	e := k.entries[i]
	end := e.addr + maxTrailingExtent
	if end < e.addr { // near the top of the address space
		end = math.MaxUint64
	}
	if i+1 < len(k.entries) {
		if next := k.entries[i+1]; next.module == e.module || next.addr < end {
			end = next.addr
		}
	}
	if addr >= end {
		return KernelSymbol{}, false
	}
	return KernelSymbol{
		Name:   k.names[e.nameOff : e.nameOff+uint32(e.nameLen)],
		Module: k.modules[e.module],
		Addr:   e.addr,
	}, true
}
