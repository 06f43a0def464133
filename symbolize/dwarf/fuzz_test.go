package dwarf

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// cProgram is small, so that fuzzing mutates a unit of a few hundred bytes, and
// inlines, so that the seeds hold inline trees.
const cProgram = `
static inline int leaf(int x) { return x * 3 + 1; }
static inline int mid(int x) { return leaf(x) ^ leaf(x + 1); }
__attribute__((noinline)) int outer(int x) { return mid(x) + mid(x * 2); }
int main(int argc, char **argv) { (void)argv; return outer(argc); }
`

func buildC(t testing.TB, flags ...string) string {
	t.Helper()
	gcc := testenv.RequireTool(t, "gcc")
	dir := t.TempDir()
	src := filepath.Join(dir, "prog.c")
	if err := os.WriteFile(src, []byte(cProgram), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "prog")
	args := append([]string{"-o", bin, src}, flags...)
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

func sectionData(t testing.TB, f *elf.File, name string) []byte {
	t.Helper()
	s := elfSection(f, name)
	if s == nil {
		return nil
	}
	b, err := s.Data()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return b
}

// probe looks up addresses all over a table, in every unit it indexes; it must
// neither panic nor loop.
func probe(t *testing.T, tab *Table) {
	for _, a := range []uint64{0, 1, 0x1000, 0x1130, 0x1140, 1 << 32, 1<<64 - 1} {
		frames, _ := tab.Lookup(a)
		for _, f := range frames {
			if f.Line < 0 {
				t.Fatalf("Lookup(%#x): negative line %d", a, f.Line)
			}
		}
	}
	for _, sp := range tab.spans {
		ut, _ := tab.unit(sp.unit)
		tab.Lookup(sp.lo)
		tab.Lookup(sp.hi - 1)
		if ut == nil {
			continue
		}
		for _, r := range ut.rows {
			tab.Lookup(r.addr)
		}
		for _, s := range ut.funcs {
			tab.Lookup(s.lo)
			tab.Lookup(s.hi - 1)
		}
	}
}

// tableOf builds a table from raw sections, as Load does from a file's.
func tableOf(info, abbrev, line, str, lineStr []byte) (*Table, error) {
	t := &Table{cache: NewCache(DefaultCacheBytes)}
	for i, b := range map[sectionIndex][]byte{secInfo: info, secAbbrev: abbrev, secLine: line, secStr: str, secLineStr: lineStr} {
		if len(b) > 0 {
			t.secs[i] = section{data: b, size: uint64(len(b))}
		}
	}
	if err := t.index(); err != nil {
		return nil, err
	}
	return t, nil
}

// FuzzTable feeds the decoder mutated DWARF sections: the index is built and every
// unit decoded and probed, which must end without a panic or a hang.
func FuzzTable(f *testing.F) {
	f.Add([]byte{}, []byte{}, []byte{}, []byte{}, []byte{})
	if _, err := exec.LookPath("gcc"); err == nil {
		for _, flags := range [][]string{{"-O2", "-g"}, {"-O2", "-gdwarf-4"}} {
			ef, err := elf.Open(buildC(f, flags...))
			if err != nil {
				f.Fatal(err)
			}
			f.Add(sectionData(f, ef, "info"), sectionData(f, ef, "abbrev"), sectionData(f, ef, "line"),
				sectionData(f, ef, "str"), sectionData(f, ef, "line_str"))
			ef.Close()
		}
	}
	f.Fuzz(func(t *testing.T, info, abbrev, line, str, lineStr []byte) {
		tab, err := tableOf(info, abbrev, line, str, lineStr)
		if err != nil {
			return
		}
		probe(t, tab)
	})
}

// FuzzLoad feeds whole ELF files, reaching section headers, compression headers and
// the size bound.
func FuzzLoad(f *testing.F) {
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	if _, err := exec.LookPath("gcc"); err == nil {
		for _, flags := range [][]string{{"-O2", "-g"}, {"-O2", "-g", "-gz"}} {
			data, err := os.ReadFile(buildC(f, flags...))
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ef, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return
		}
		// A bound a little over the seeds' sections: mutated headers claiming more
		// must be refused before anything that large is allocated. The file is read
		// both ways: through debug/elf, and in place as from a mapping.
		for _, file := range [][]byte{nil, data} {
			tab, err := Load(ef, Options{MaxBytes: 1 << 20, File: file})
			if err != nil {
				continue
			}
			probe(t, tab)
			tab.Trim()
			probe(t, tab)
			tab.Close()
		}
	})
}

func TestLoadCorrupt(t *testing.T) {
	bin := buildC(t, "-O2", "-g")
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range [][]byte{nil, data} {
		if _, err := Load(ef, Options{File: file}); err != nil {
			t.Fatalf("the intact file: %v", err)
		}
	}
	info, line := ef.Section(".debug_info"), ef.Section(".debug_line")
	// The index of .debug_info's section header, to point its sh_offset elsewhere.
	infoIdx := slices.Index(ef.Sections, info)
	shoff := binary.LittleEndian.Uint64(data[0x28:])
	for _, tc := range []struct {
		name   string
		mutate func(b []byte)
	}{
		{"info overwritten with 0xff", func(b []byte) {
			for i := range min(64, int(info.Size)) {
				b[int(info.Offset)+i] = 0xff
			}
		}},
		{"line program longer than its section", func(b []byte) {
			binary.LittleEndian.PutUint32(b[line.Offset:], uint32(line.Size)+100)
		}},
		// debug/dwarf sizes the directory table from this count before reading it:
		// unchecked, 2³²-1 entries of 16 bytes end the process.
		{"directory count past the end of the unit", func(b []byte) {
			at := int(line.Offset) + dirCountOffset(t, data[line.Offset:])
			copy(b[at:], []byte{0xff, 0xff, 0xff, 0xff, 0x0f})
		}},
		{"directory entries of no known form", func(b []byte) {
			at := int(line.Offset) + dirCountOffset(t, data[line.Offset:])
			b[at-1] = 0x01 // DW_FORM_addr, which debug/dwarf reads as nothing
		}},
		// debug/dwarf reads an unterminated LEB128 as 0 without moving on: a null entry,
		// again and again.
		{"entries of one unterminated LEB128", func(b []byte) {
			unit := b[info.Offset:]
			end := 4 + int(binary.LittleEndian.Uint32(unit))
			for i := 12; i < end; i++ {
				unit[i] = 0xfa
			}
		}},
		{"info section past the end of the file", func(b []byte) {
			binary.LittleEndian.PutUint64(b[shoff+uint64(infoIdx)*64+24:], uint64(len(b))-8)
		}},
	} {
		bad := bytes.Clone(data)
		tc.mutate(bad)
		ef, err := elf.NewFile(bytes.NewReader(bad))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, file := range [][]byte{nil, bad} {
			if _, err := Load(ef, Options{File: file}); err == nil {
				t.Errorf("%s: Load (mapped %v) succeeded", tc.name, file != nil)
			}
		}
	}
}

// dirCountOffset finds the directory count in the first DWARF 5 line header of a
// 32-bit .debug_line.
func dirCountOffset(t *testing.T, line []byte) int {
	t.Helper()
	h := lineHeader{b: line, order: binary.LittleEndian}
	h.u32()
	if v := h.u16(); v != 5 {
		t.Fatalf("line table version %d, want 5", v)
	}
	h.skip(2 + 4 + 5)
	h.skip(int(h.u8()) - 1)
	for range h.u8() {
		h.uleb()
		h.uleb()
	}
	if h.err != nil {
		t.Fatal(h.err)
	}
	return len(line) - len(h.b)
}

// A compression header may claim any size; the bound refuses it before reading.
func TestLoadHostileCompressedSize(t *testing.T) {
	bin := buildC(t, "-O2", "-g", "-gz")
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	info := ef.Section(".debug_info")
	if info.Flags&elf.SHF_COMPRESSED == 0 {
		t.Fatal("gcc -gz left .debug_info uncompressed")
	}
	// Elf64_Chdr: ch_type, ch_reserved, ch_size, ch_addralign.
	bad := bytes.Clone(data)
	binary.LittleEndian.PutUint64(bad[info.Offset+8:], 1<<40)
	ef2, err := elf.NewFile(bytes.NewReader(bad))
	if err != nil {
		t.Fatal(err)
	}
	for _, mapped := range []bool{false, true} {
		file, file2 := []byte(nil), []byte(nil)
		if mapped {
			file, file2 = data, bad
		}
		if _, err := Load(ef2, Options{MaxBytes: 64 << 20, File: file2}); err == nil || !strings.Contains(err.Error(), "exceed") {
			t.Errorf("Load (mapped %v) with a 1 TiB .debug_info: %v, want the bound refusing it", mapped, err)
		}
		// Without a bound the stream ends long before the claimed size: an error, and
		// memory grows with the real data only.
		if _, err := Load(ef2, Options{File: file2}); err == nil {
			t.Errorf("Load (mapped %v) of a section shorter than its header claims succeeded", mapped)
		}
		if _, err := Load(ef, Options{MaxBytes: 64 << 20, File: file}); err != nil {
			t.Errorf("the intact file (mapped %v): %v", mapped, err)
		}
	}
}

func TestLoadNoDWARF(t *testing.T) {
	bin := buildC(t, "-O2")
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	if HasDWARF(ef) {
		t.Fatal("HasDWARF of a file built without -g")
	}
	if _, err := Load(ef, Options{}); err != ErrNoDWARF {
		t.Errorf("Load: %v, want ErrNoDWARF", err)
	}
}
