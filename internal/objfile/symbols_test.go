package objfile

import (
	"debug/elf"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// Reading a table in place gives what debug/elf's list does, entry for entry: the
// dynamic symbols of the host's libc (versioned) and the .symtab of a program gcc built.
func TestSymbolsAgreeWithDebugELF(t *testing.T) {
	gcc := testenv.RequireTool(t, "gcc")
	dir := t.TempDir()
	src, exe := filepath.Join(dir, "p.c"), filepath.Join(dir, "p")
	if err := os.WriteFile(src, []byte("#include <stdlib.h>\nint main(void) { return malloc(1) == 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-O1", "-o", exe, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	for _, c := range []struct {
		path string
		typ  elf.SectionType
	}{
		{"/lib/x86_64-linux-gnu/libc.so.6", elf.SHT_DYNSYM},
		{exe, elf.SHT_SYMTAB},
	} {
		f, err := elf.Open(c.path)
		if err != nil {
			t.Fatal(err)
		}
		want, err := f.Symbols()
		if c.typ == elf.SHT_DYNSYM {
			want, err = f.DynamicSymbols()
		}
		if err != nil {
			t.Fatal(err)
		}
		syms, err := OpenSymbols(f, c.typ)
		if err != nil || syms == nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if syms.Len() != len(want)+1 { // debug/elf leaves the null symbol out
			t.Fatalf("%s: %d entries, debug/elf has %d and the null symbol", c.path, syms.Len(), len(want))
		}
		for i, w := range want {
			got := syms.At(i + 1)
			if name := syms.Name(i + 1); name != w.Name || !syms.NameIs(i+1, w.Name) {
				t.Fatalf("%s: entry %d named %q, want %q", c.path, i+1, name, w.Name)
			}
			if got.Index != i+1 || got.Info != w.Info || got.Section != w.Section || got.Value != w.Value || got.Size != w.Size {
				t.Fatalf("%s: entry %d = %+v, want %+v", c.path, i+1, got, w)
			}
		}
		name := "malloc"
		if c.typ == elf.SHT_SYMTAB {
			name = "main"
		}
		s, ok, err := FindSymbol(f, c.typ, name, true)
		if err != nil || !ok || s.Value == 0 || s.Section == elf.SHN_UNDEF {
			t.Errorf("%s: FindSymbol(%s) = %+v, %v, %v", c.path, name, s, ok, err)
		}
		f.Close()
	}
}

// A name offset outside the string table, or a name running to its end unterminated,
// names nothing rather than reading past it.
func TestSymbolsHostileNames(t *testing.T) {
	syms := make([]byte, 3*symSize)
	binary.LittleEndian.PutUint32(syms[symSize:], 1<<31) // far outside
	binary.LittleEndian.PutUint32(syms[2*symSize:], 2)   // "cd", unterminated
	tab := &Symbols{syms: syms, strs: []byte("\x00abcd"), order: binary.LittleEndian}
	for i := 1; i < tab.Len(); i++ {
		if n := tab.Name(i); n != "" {
			t.Errorf("entry %d named %q", i, n)
		}
		if tab.NameIs(i, "cd") || tab.NameIs(i, "bcd") {
			t.Errorf("entry %d matched a name running off the table", i)
		}
	}
}
