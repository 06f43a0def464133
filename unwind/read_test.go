package unwind

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"slices"
	"testing"
)

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withoutSectionHeaders returns a copy of an ELF file as sstrip leaves it.
func withoutSectionHeaders(b []byte) []byte {
	b = slices.Clone(b)
	binary.LittleEndian.PutUint64(b[40:], 0) // e_shoff
	binary.LittleEndian.PutUint16(b[60:], 0) // e_shnum
	binary.LittleEndian.PutUint16(b[62:], 0) // e_shstrndx
	return b
}

// renameSection returns a copy of an ELF file with a section's name changed in place.
func renameSection(t testing.TB, b []byte, from, to string) []byte {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	s := f.Section(".shstrtab")
	if s == nil || len(from) != len(to) {
		t.Fatal("cannot rename")
	}
	b = slices.Clone(b)
	strtab := b[s.Offset : s.Offset+s.Size]
	i := bytes.Index(strtab, []byte(from+"\x00"))
	if i < 0 {
		t.Fatalf("no %s in .shstrtab", from)
	}
	copy(strtab[i:], to)
	return b
}

// TestFileVariants checks that the ways of finding .eh_frame agree on real files: the
// header's table, a linear walk when there is no header, and PT_GNU_EH_FRAME when section
// headers are gone.
func TestFileVariants(t *testing.T) {
	files := map[string]func(t *testing.T) string{
		"libc": func(t *testing.T) string { requireFile(t, libcPath); return libcPath },
		"pie":  func(t *testing.T) string { return requireTestBinary(t, "pie") },
	}
	for name, path := range files {
		t.Run(name, func(t *testing.T) {
			b := readFile(t, path(t))
			base := readBytes(t, b)
			if len(base.Rows) == 0 {
				t.Fatal("no rows")
			}
			linear := readBytes(t, renameSection(t, b, ".eh_frame_hdr", ".eh_frame_hdX"))
			if !slices.Equal(linear.Rows, base.Rows) {
				t.Errorf("linear walk: %d rows, header table: %d rows", len(linear.Rows), len(base.Rows))
			}
			stripped := readBytes(t, withoutSectionHeaders(b))
			if stripped.Source != ".eh_frame" || !slices.Equal(stripped.Rows, base.Rows) {
				t.Errorf("without section headers: %d rows from %s, with: %d rows", len(stripped.Rows), stripped.Source, len(base.Rows))
			}
		})
	}
}

func TestReadErrors(t *testing.T) {
	eh := func() []byte {
		w := &cfiWriter{}
		c := w.cie(false, 1, "", 1, -8, regRA, nil, initIns...)
		w.fde(false, c, func() { w.u64(0x1000); w.u64(0x10) }, nil)
		return w.b
	}()
	elf32 := synELF(elf.ET_DYN, synSec{name: ".eh_frame", typ: elf.SHT_PROGBITS, data: eh})
	elf32[4] = byte(elf.ELFCLASS32)
	for name, b := range map[string][]byte{
		"empty":       nil,
		"not elf":     []byte("#!/bin/sh\necho hello\n"),
		"32-bit":      elf32,
		"relocatable": synELF(elf.ET_REL, synSec{name: ".eh_frame", typ: elf.SHT_PROGBITS, data: eh}),
		"no frames":   synELF(elf.ET_DYN, textSec()),
		"nobits only": synELF(elf.ET_DYN, synSec{name: ".eh_frame", typ: elf.SHT_NOBITS, data: eh}),
	} {
		if tab, err := Read(bytes.NewReader(b)); err == nil {
			t.Errorf("%s: no error, %d rows", name, len(tab.Rows))
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

func TestLookup(t *testing.T) {
	tab := &Table{Rows: []Row{sp(0x1000, 8), sp(0x1004, 16), invalid(0x1010), {PC: 0x1100, CFA: CFAEndOfStack}, invalid(0x1108)}}
	for _, tc := range []struct {
		pc   uint64
		want Row
		ok   bool
	}{
		{0xfff, Row{}, false},
		{0x1000, sp(0x1000, 8), true},
		{0x1003, sp(0x1000, 8), true},
		{0x1004, sp(0x1004, 16), true},
		{0x100f, sp(0x1004, 16), true},
		{0x1010, invalid(0x1010), false},
		{0x1107, Row{PC: 0x1100, CFA: CFAEndOfStack}, true},
		{0x1108, invalid(0x1108), false},
		{^uint64(0), invalid(0x1108), false},
	} {
		got, ok := tab.Lookup(tc.pc)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Lookup(%#x) = %s %v, want %s %v", tc.pc, got.String(), ok, tc.want.String(), tc.ok)
		}
	}
}

// FuzzRead feeds corrupt files to Read, which must return an error or a well-formed table,
// never panic.
func FuzzRead(f *testing.F) {
	if p, err := testBinary("pie"); err == nil {
		b := readFile(f, p)
		f.Add(b)
		f.Add(b[:len(b)*2/3])
		f.Add(withoutSectionHeaders(b))
	}
	if p, err := testBinary("debugframe"); err == nil {
		f.Add(readFile(f, p))
	}
	w := &cfiWriter{debug: true}
	c := w.cie(true, 4, "", 4, -8, regRA, nil, initIns...)
	w.fde(true, c, func() { w.u64(synText); w.u64(0x40) }, nil, cfaAdvanceLoc|1, cfaDefCFAOffset, 16, cfaRememberState, cfaAdvanceLoc|1, cfaRestoreState)
	f.Add(synELF(elf.ET_DYN, textSec(), synSec{name: ".debug_frame", typ: elf.SHT_PROGBITS, data: w.b}))
	f.Add(ehFrameFile(f, true, func(w *cfiWriter) []int {
		c := w.cie(false, 1, "zPLRS", 1, -8, regRA, func() {
			w.u8(peIndirect|pePCRel|peSdata4, 0, 0, 0, 0, pePCRel|peSdata4, pePCRel|peSdata4)
		}, initIns...)
		c2 := w.cie(false, 3, "zR", 1, -8, regRA, func() { w.u8(pePCRel | peSdata4) }, initIns...)
		return []int{
			w.fde(false, c, func() { w.pcrel4(0x1000); w.u32(0x10) }, []byte{0, 0, 0, 0}),
			w.fde(false, c2, func() { w.pcrel4(0x1010); w.u32(0x20) }, noAug,
				cfaDefCFAExpression, 11, 0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22),
		}
	}))

	f.Add(synGoFile())

	f.Fuzz(func(t *testing.T, b []byte) {
		// A Go binary's table too: its pclntab, build information and DWARF are input;
		// and the FDEs that name stripped code.
		if ef, err := elf.NewFile(bytes.NewReader(b)); err == nil {
			if ranges, err := FunctionRanges(ef); err == nil {
				for i := 1; i < len(ranges); i++ {
					if ranges[i].Start < ranges[i-1].End || ranges[i].End <= ranges[i].Start {
						t.Fatalf("function ranges overlap: %+v %+v", ranges[i-1], ranges[i])
					}
				}
			}
			if g, err := ReadGoRuntime(ef, bytes.NewReader(b)); err == nil {
				if tab, err := goTable(ef, g); err == nil {
					checkSorted(t, tab)
				}
			}
		}
		tab, err := Read(bytes.NewReader(b))
		if err != nil {
			return
		}
		checkSorted(t, tab)
	})
}

func BenchmarkLibcTable(b *testing.B) {
	if _, err := os.Stat(libcPath); err != nil {
		b.Skip(err)
	}
	data := readFile(b, libcPath)
	b.ReportAllocs()
	var tab *Table
	for b.Loop() {
		var err error
		if tab, err = Read(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(tab.Rows)), "rows")
	// The BPF map encodes a row in 12 bytes.
	b.ReportMetric(float64(len(tab.Rows)*12), "bpf-bytes")
}
