package unwind

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// goFuncs is the part of a Go binary's pclntab that following the runtime's stack
// switches needs: where functions start and end, by name, and how far each moves the
// stack pointer (pcsp). Only the layout of Go 1.18 and later is read: the runtime's
// switches are followed from Go 1.21 on.
type goFuncs struct {
	sec       *elf.Section
	data      []byte // the whole pclntab
	flagOff   uint64 // where _func keeps its flags
	ptrSize   int
	quantum   uint64
	nfunc     int
	textStart uint64
	funcnames []byte
	pctab     []byte
	functab   []byte // nfunc+1 entries of (entryoff, funcoff), then the _func structs
}

// goFunc is a function of the pclntab.
type goFunc struct {
	entry, end uint64
	pcsp       uint32 // offset of its pcsp table in pctab
	asm        bool   // written in assembly (FuncFlagAsm), not the compiler's wrapper of it
}

// funcFlagAsm marks a function implemented in assembly (abi.FuncFlagAsm).
const funcFlagAsm = 1 << 2

var errNoPclntab = errors.New("unwind: no Go 1.18+ pclntab")

// maxPclntab bounds the pclntab read; the Go compiler's is 10 MB.
const maxPclntab = 256 << 20

// readGoFuncs reads the pclntab of f.
func readGoFuncs(f *elf.File) (*goFuncs, error) {
	s := f.Section(".gopclntab")
	if s == nil || s.Type == elf.SHT_NOBITS {
		return nil, errNoPclntab
	}
	data, err := sectionData(s)
	if err != nil {
		return nil, err
	}
	if len(data) > maxPclntab {
		return nil, fmt.Errorf("unwind: pclntab of %d bytes", len(data))
	}
	if len(data) < 8 {
		return nil, errNoPclntab
	}
	le := binary.LittleEndian
	g := &goFuncs{sec: s, data: data, quantum: uint64(data[6]), ptrSize: int(data[7])}
	switch le.Uint32(data) {
	case 0xfffffff0: // Go 1.18-1.19: _func has no startLine
		g.flagOff = 37
	case 0xfffffff1: // Go 1.20 and later
		g.flagOff = 41
	default:
		return nil, errNoPclntab
	}
	if g.ptrSize != 8 || g.quantum == 0 {
		return nil, errNoPclntab
	}
	word := func(i int) uint64 {
		off := 8 + i*8
		if off+8 > len(data) {
			return 0
		}
		return le.Uint64(data[off:])
	}
	section := func(off uint64) []byte {
		if off > uint64(len(data)) {
			return nil
		}
		return data[off:]
	}
	nfunc := word(0)
	g.textStart = word(2)
	g.funcnames, g.pctab, g.functab = section(word(3)), section(word(6)), section(word(7))
	if nfunc == 0 || nfunc > uint64(len(g.functab))/8 || g.funcnames == nil || g.pctab == nil {
		return nil, fmt.Errorf("unwind: corrupt pclntab header")
	}
	g.nfunc = int(nfunc)
	// A PIE's pclntab holds text's address as the linker saw it; runtime.text, the first
	// symbol of Go's text, says where it is. A stripped binary has no symbols, and its
	// header may say 0: .text's address is where an internally linked binary's Go code
	// starts, taken when runtime.goexit is then where its code says it is.
	if text, _, ok := objfile.LookupSymbol(f, "runtime.text"); ok {
		g.textStart = text
	} else if s := f.Section(".text"); s != nil && g.textStart != s.Addr && g.goexitAt(f, s.Addr) {
		g.textStart = s.Addr
	}
	return g, nil
}

// goexitAt tells whether, with Go's text starting at text, runtime.goexit is where the
// file holds its amd64 code: NOP, CALL runtime.goexit1, NOP (asm_amd64.s), the call's
// target runtime.goexit1's entry.
func (g *goFuncs) goexitAt(f *elf.File, text uint64) bool {
	saved := g.textStart
	g.textStart = text
	defer func() { g.textStart = saved }()
	found := g.find(map[string]bool{"runtime.goexit": true, "runtime.goexit1": true})
	exit, ok1 := found["runtime.goexit"]
	exit1, ok2 := found["runtime.goexit1"]
	if !ok1 || !ok2 || f.Machine != elf.EM_X86_64 {
		return false
	}
	var code [7]byte
	if !readCode(f, code[:], exit.entry) {
		return false
	}
	target := exit.entry + 6 + uint64(int64(int32(binary.LittleEndian.Uint32(code[2:6]))))
	return code[0] == 0x90 && code[1] == 0xe8 && code[6] == 0x90 && target == exit1.entry
}

func (g *goFuncs) u32(b []byte, off uint64) (uint32, bool) {
	if off+4 > uint64(len(b)) || off+4 < off {
		return 0, false
	}
	return binary.LittleEndian.Uint32(b[off:]), true
}

// funcAt returns the i-th function of the table.
func (g *goFuncs) funcAt(i int) (goFunc, string, bool) {
	entryOff, ok1 := g.u32(g.functab, uint64(i)*8)
	funcOff, ok2 := g.u32(g.functab, uint64(i)*8+4)
	endOff, ok3 := g.u32(g.functab, uint64(i+1)*8)
	if !ok1 || !ok2 || !ok3 || endOff < entryOff {
		return goFunc{}, "", false
	}
	// _func: entryOff, nameOff, args, deferreturn, pcsp, ...
	nameOff, ok4 := g.u32(g.functab, uint64(funcOff)+4)
	pcsp, ok5 := g.u32(g.functab, uint64(funcOff)+16)
	if !ok4 || !ok5 || uint64(nameOff) >= uint64(len(g.funcnames)) || uint64(funcOff)+g.flagOff >= uint64(len(g.functab)) {
		return goFunc{}, "", false
	}
	asm := g.functab[uint64(funcOff)+g.flagOff]&funcFlagAsm != 0
	name := g.funcnames[nameOff:]
	for j, c := range name {
		if c == 0 {
			name = name[:j]
			break
		}
	}
	return goFunc{entry: g.textStart + uint64(entryOff), end: g.textStart + uint64(endOff), pcsp: pcsp, asm: asm}, string(name), true
}

// find returns the functions of the table named in want, by name. An assembly function
// called from Go code shares its name with the compiler's wrapper that calls it; the
// assembly one is what the walk meets.
func (g *goFuncs) find(want map[string]bool) map[string]goFunc {
	out := map[string]goFunc{}
	for i := range g.nfunc {
		// The scan reads every function's entry and name: all of a large program's
		// table but its line tables, 8 of the Collector's 13 MB, resident at once
		// unless given back as it goes.
		if i%1024 == 0 && i > 0 {
			objfile.GiveBack(g.sec, g.data)
		}
		fn, name, ok := g.funcAt(i)
		if !ok || !want[name] {
			continue
		}
		if have, dup := out[name]; dup && have.asm && !fn.asm {
			continue
		}
		out[name] = fn
	}
	return out
}

// spDeltas decodes a function's pcsp table: for each range of its code, how far below
// the stack pointer at entry (where the return address is) the stack pointer is.
func (g *goFuncs) spDeltas(fn goFunc) ([]Row, bool) {
	if uint64(fn.pcsp) >= uint64(len(g.pctab)) {
		return nil, false
	}
	r := reader{b: g.pctab, off: int(fn.pcsp)}
	pc, val := fn.entry, int64(-1)
	var rows []Row
	for first := true; ; first = false {
		uv := r.uleb()
		if r.bad || (uv == 0 && !first) {
			break
		}
		if uv&1 != 0 {
			val += -int64(uv>>1) - 1
		} else {
			val += int64(uv >> 1)
		}
		d := r.uleb()
		if r.bad || d > fn.end-fn.entry {
			return nil, false
		}
		if val < 0 || val > 1<<20 {
			return nil, false
		}
		rows = append(rows, Row{PC: pc, CFA: CFASP, CFAOffset: int32(val) + 8})
		pc += d * g.quantum
		if pc >= fn.end || len(rows) > 1<<16 {
			break
		}
	}
	return rows, len(rows) > 0
}

// readCode reads len(b) bytes of the section holding vaddr.
func readCode(f *elf.File, b []byte, vaddr uint64) bool {
	for _, s := range f.Sections {
		if s.Type == elf.SHT_NOBITS || s.Flags&elf.SHF_ALLOC == 0 || vaddr < s.Addr || vaddr+uint64(len(b)) > s.Addr+s.Size {
			continue
		}
		n, err := s.ReadAt(b, int64(vaddr-s.Addr))
		return err == nil && n == len(b)
	}
	return false
}
