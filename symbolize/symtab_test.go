package symbolize

import (
	"debug/elf"
	"math/rand/v2"
	"testing"
)

func TestSymbolTableAliases(t *testing.T) {
	at := func(addr uint64, syms ...Symbol) []Symbol {
		for i := range syms {
			syms[i].Value, syms[i].Size = addr, 0x10
		}
		return syms
	}
	var syms []Symbol
	syms = append(syms, at(0x1000,
		Symbol{Name: "a_local", Binding: elf.STB_LOCAL},
		Symbol{Name: "weak_name", Binding: elf.STB_WEAK},
		Symbol{Name: "global_long_name", Binding: elf.STB_GLOBAL},
	)...)
	syms = append(syms, at(0x2000,
		Symbol{Name: "zz", Binding: elf.STB_GLOBAL},
		Symbol{Name: "aa", Binding: elf.STB_GLOBAL},
		Symbol{Name: "longest", Binding: elf.STB_GLOBAL},
	)...)
	syms = append(syms, at(0x3000,
		Symbol{Name: "b", Binding: elf.STB_LOCAL},
		Symbol{Name: "weak_b", Binding: elf.STB_WEAK},
		Symbol{Name: "a", Binding: elf.STB_LOCAL},
	)...)
	want := map[uint64]string{0x1000: "global_long_name", 0x2000: "aa", 0x3000: "weak_b"}

	// The choice must not depend on the order the symbol tables list aliases in.
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		r.Shuffle(len(syms), func(i, j int) { syms[i], syms[j] = syms[j], syms[i] })
		tab := NewSymbolTable(syms)
		if tab.Len() != len(want) {
			t.Fatalf("Len() = %d, want %d", tab.Len(), len(want))
		}
		for addr, name := range want {
			got, ok := tab.Lookup(addr + 4)
			if !ok || got.Name != name || got.Value != addr {
				t.Fatalf("Lookup(%#x) = %+v, %v; want %s", addr+4, got, ok, name)
			}
		}
	}
}

func TestSymbolTableExtents(t *testing.T) {
	tab := NewSymbolTable([]Symbol{
		{Name: "sized", Value: 0x100, Size: 0x20},
		{Name: "unsized", Value: 0x200},
		{Name: "next", Value: 0x280, Size: 0x10},
		{Name: "alias_with_size", Value: 0x300},
		{Name: "alias_with_size2", Value: 0x300, Size: 0x8},
		{Name: "last_unsized", Value: 0x400},
	})
	for _, tc := range []struct {
		addr uint64
		want string // "" for no symbol
	}{
		{0xff, ""},
		{0x100, "sized"},
		{0x11f, "sized"},
		{0x120, ""}, // past the size, before the next symbol
		{0x1ff, ""},
		{0x200, "unsized"},
		{0x27f, "unsized"}, // unsized reaches the next symbol
		{0x280, "next"},
		{0x290, ""},
		{0x307, "alias_with_size"}, // an alias's size serves the chosen name
		{0x308, ""},
		{0x400, "last_unsized"},
		{1<<64 - 2, "last_unsized"},
	} {
		got, ok := tab.Lookup(tc.addr)
		if tc.want == "" {
			if ok {
				t.Errorf("Lookup(%#x) = %q, want none", tc.addr, got.Name)
			}
			continue
		}
		if !ok || got.Name != tc.want {
			t.Errorf("Lookup(%#x) = %q, %v; want %q", tc.addr, got.Name, ok, tc.want)
		}
	}
	if got, _ := tab.Lookup(0x210); got.Size != 0x80 {
		t.Errorf("unsized symbol's Size = %#x, want the %#x it reaches", got.Size, 0x80)
	}
	if got, _ := tab.Lookup(0x300); got.Binding != elf.STB_LOCAL {
		t.Errorf("Binding = %v, want the chosen alias's", got.Binding)
	}
	if _, ok := NewSymbolTable(nil).Lookup(0x100); ok {
		t.Error("empty table found a symbol")
	}
}

// Unsized symbols in an ELF file end at their section, so that code in a later section
// without symbols (the PLT) is not named after the last function before it.
func TestSymbolTableSectionLimit(t *testing.T) {
	names := nameTable{s: "_init\x00_start\x00"}
	tab := newSymbolTable([]candidate{
		{value: 0x1000, limit: 0x101b, nameOff: 0, nameLen: 5},
		{value: 0x1040, size: 0x20, limit: 0x2000, nameOff: 6, nameLen: 6},
	}, []nameTable{names})
	if got, ok := tab.Lookup(0x101a); !ok || got.Name != "_init" {
		t.Errorf("Lookup(0x101a) = %q, %v", got.Name, ok)
	}
	if got, ok := tab.Lookup(0x1020); ok {
		t.Errorf("Lookup(0x1020) past _init's section = %q", got.Name)
	}
}
