package unwind

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"testing"
)

// synPclntab lays out a Go 1.20+ pclntab for functions at text-relative offsets, each
// with a pcsp table of (value, bytes) runs.
type synFunc struct {
	name       string
	start, end uint32
	asm        bool
	sp         [][2]int
}

func synPclntab(text uint64, funcs []synFunc) []byte {
	le := binary.LittleEndian
	var names, pctab []byte
	nameOff := make([]int, len(funcs))
	pcspOff := make([]int, len(funcs))
	pctab = append(pctab, 0) // offset 0 means none
	for i, f := range funcs {
		nameOff[i] = len(names)
		names = append(append(names, f.name...), 0)
		pcspOff[i] = len(pctab)
		val := -1
		for j, run := range f.sp {
			d := run[0] - val
			var uv uint64
			if d < 0 {
				uv = uint64(-d-1)<<1 | 1
			} else {
				uv = uint64(d) << 1
			}
			if j == 0 && uv == 0 {
				uv = 2 // a zero first delta cannot be encoded; tests avoid it
			}
			pctab = binary.AppendUvarint(pctab, uv)
			pctab = binary.AppendUvarint(pctab, uint64(run[1]))
			val = run[0]
		}
		pctab = append(pctab, 0)
	}
	functab := make([]byte, (len(funcs)+1)*8)
	for i, f := range funcs {
		le.PutUint32(functab[i*8:], f.start)
		le.PutUint32(functab[i*8+4:], uint32(len(functab)))
		fn := make([]byte, 44)
		le.PutUint32(fn[0:], f.start)
		le.PutUint32(fn[4:], uint32(nameOff[i]))
		le.PutUint32(fn[16:], uint32(pcspOff[i]))
		if f.asm {
			fn[41] = funcFlagAsm
		}
		functab = append(functab, fn...)
	}
	le.PutUint32(functab[len(funcs)*8:], funcs[len(funcs)-1].end)
	hdr := make([]byte, 72)
	le.PutUint32(hdr, 0xfffffff1)
	hdr[6], hdr[7] = 1, 8
	words := []uint64{uint64(len(funcs)), 0, text, 72, 0, 0, uint64(72 + len(names)), uint64(72 + len(names) + len(pctab))}
	for i, w := range words {
		le.PutUint64(hdr[8+i*8:], w)
	}
	return append(append(append(hdr, names...), pctab...), functab...)
}

// synGoFile is an ELF file with just a pclntab: the runtime's switches, cgo's entry and
// Go's signal restorer.
func synGoFile() []byte {
	tab := synPclntab(synText, []synFunc{
		{name: "runtime.systemstack", start: 0x100, end: 0x140},            // the compiler's wrapper
		{name: "runtime.systemstack", start: 0x140, end: 0x180, asm: true}, // the assembly
		{name: "crosscall2", start: 0x180, end: 0x1c0, asm: true, sp: [][2]int{{0, 4}, {80, 0x20}, {8, 0x1c}}},
		{name: "runtime.sigreturn__sigaction", start: 0x1c0, end: 0x1d0, asm: true},
		{name: "runtime.goexit", start: 0x1d0, end: 0x1e0, asm: true},
		{name: "main.main", start: 0x1e0, end: 0x200},
	})
	return synELF(elf.ET_EXEC, textSec(), synSec{name: ".gopclntab", typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC, addr: 0x5000, data: tab})
}

func TestReadGoRuntimeSynthetic(t *testing.T) {
	if !tableArch {
		t.Skip("go tables are built for x86-64 only")
	}
	b := synGoFile()
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	g, err := ReadGoRuntime(f, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	// No build information: no release, so no layout and no switches; cgo's entry, the
	// restorer and the roots need none.
	tab, err := goTable(f, g)
	if err != nil {
		t.Fatal(err)
	}
	wantRows(t, tab, []Row{
		{CFA: CFAFramePointer},
		sp(synText+0x180, 8), sp(synText+0x184, 88), sp(synText+0x1a4, 16),
		{PC: synText + 0x1bf, CFA: CFASignal},
		{PC: synText + 0x1d0, CFA: CFAFramePointer},
	})
}
