package unwind

import (
	"bytes"
	"debug/buildinfo"
	"debug/dwarf"
	"debug/elf"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/objfile"
)

// A Go binary has no call frame information for Go code: Go keeps frame pointers, and
// the kernel walks its frames by them. What frame pointers do not cross are the Go
// runtime's own switches between stacks: runtime.systemstack and morestack run code on
// the thread's g0 stack, asmcgocall runs C there, cgocallback comes back from C onto the
// goroutine's stack, and signal handlers run on a stack of their own. A Go binary's table
// says where those functions are (CFAGo rows), how far the few assembly functions that
// the walk passes through without frame pointers move the stack (CFASP rows from the
// pclntab's pcsp tables), and where Go's signal trampoline returns to (CFASignal); it
// covers cgo's C code with that code's .eh_frame; the rest is CFAFramePointer. The
// runtime's layout (KernelGoRuntime) says where the switches saved the goroutine's
// registers.

// GoRuntime is what the kernel walker needs of one Go binary.
type GoRuntime struct {
	// Version is the Go release that built the binary, as its build information says.
	Version string
	// Layout locates the running goroutine and its saved registers; nil when neither
	// the binary's DWARF nor its Go version gives the offsets, and the switches through
	// g0 are then left to frame pointers.
	Layout *KernelGoRuntime
	// LayoutSource says where Layout came from: "dwarf" or "version".
	LayoutSource string
	// Rows describe the runtime functions the walk must know, by ELF virtual address,
	// each range ending in a row of the rule after it.
	Rows []Row
	// Probes is where the goroutines of a binary of Go's register ABI park and run
	// again; zero when it cannot be told.
	Probes GoProbes
}

// GoProbes are the file offsets of the code off-CPU profiles of goroutines probe: the
// PUSHQ BP of runtime.gopark's prologue (Park), the goroutine about to park in the g
// register, and of runtime.execute's (Execute), the goroutine the scheduler runs next in
// its first argument's register. The kernel emulates a push where it hit a uprobe, where
// most instructions it steps out of line, a second trap: probed at a push, a goroutine
// switch in a Go program costs about 2 µs here instead of 60.
type GoProbes struct {
	Park, Execute uint64
}

// goParkProbe and goExecuteProbe are the functions GoProbes point into.
const (
	goParkProbe    = "runtime.gopark"
	goExecuteProbe = "runtime.execute"
)

// framePointerSet is the x86-64 prologue's PUSHQ BP; MOVQ SP, BP.
var framePointerSet = []byte{0x55, 0x48, 0x89, 0xe5}

// stackCheck is how the compiler's prologue of a function with a small frame begins on
// amd64: CMPQ SP, 16(R14), then a JBE to its call of morestack.
var stackCheck = []byte{0x49, 0x3b, 0x66, 0x10}

// prologuePush returns the offset of the PUSHQ BP in code, a Go function's first bytes,
// when they are the compiler's prologue: the stack check, its JBE (rel32 or rel8), and
// PUSHQ BP; MOVQ SP, BP. A uprobe's breakpoint replaces an instruction's first byte, and
// the kernel emulates it there: anywhere but on an instruction's start it would corrupt
// the program's code, so anything else gets no probe.
func prologuePush(code []byte) (int, bool) {
	if !bytes.HasPrefix(code, stackCheck) {
		return 0, false
	}
	rest := code[len(stackCheck):]
	var push int
	switch {
	case len(rest) >= 2 && rest[0] == 0x0f && rest[1] == 0x86: // JBE rel32
		push = len(stackCheck) + 6
	case len(rest) >= 1 && rest[0] == 0x76: // JBE rel8
		push = len(stackCheck) + 2
	default:
		return 0, false
	}
	if push > len(code) || !bytes.HasPrefix(code[push:], framePointerSet) {
		return 0, false
	}
	return push, true
}

// goProbes finds GoProbes in a binary, and the address of Park: the push of each
// function's prologue (prologuePush). Releases before Go's register ABI (1.17) keep
// arguments on the stack, where the probes do not look.
func goProbes(f *elf.File, r io.ReaderAt, found map[string]goFunc, minor int) (GoProbes, uint64) {
	if minor < 17 {
		return GoProbes{}, 0
	}
	var at [2]uint64
	var parkVaddr uint64
	for i, name := range []string{goParkProbe, goExecuteProbe} {
		fn, ok := found[name]
		if !ok {
			return GoProbes{}, 0
		}
		off, ok := vaddrToOffset(f, fn.entry)
		if !ok {
			return GoProbes{}, 0
		}
		var code [16]byte
		n, _ := r.ReadAt(code[:min(uint64(len(code)), fn.end-fn.entry)], int64(off))
		push, ok := prologuePush(code[:n])
		if !ok {
			return GoProbes{}, 0
		}
		at[i] = off + uint64(push)
		if i == 0 {
			parkVaddr = fn.entry + uint64(push)
		}
	}
	return GoProbes{Park: at[0], Execute: at[1]}, parkVaddr
}

// vaddrToOffset finds where in the file the loader takes the byte at vaddr from.
func vaddrToOffset(f *elf.File, vaddr uint64) (uint64, bool) {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && vaddr >= p.Vaddr && vaddr < p.Vaddr+p.Filesz {
			return p.Off + (vaddr - p.Vaddr), true
		}
	}
	return 0, false
}

// goLayouts are the offsets the Go releases that follow the switches as sonde does (1.21
// and later: systemstack saves the goroutine's registers in g.sched before it switches)
// use on amd64, for binaries without DWARF. TestGoLayoutsMatchDWARF checks them against
// the DWARF of binaries built with these releases.
var goLayouts = []struct {
	minor  int // from this Go 1.minor on
	layout KernelGoRuntime
}{
	{21, KernelGoRuntime{G_m: 48, G_sched: 56, M_curg: 192, G_status: 144, GobufSp: 0, GobufPc: 8, GobufBp: 48, G_stackHi: 8}},
	// g grew by eight bytes before atomicstatus in 1.23.
	{23, KernelGoRuntime{G_m: 48, G_sched: 56, M_curg: 192, G_status: 152, GobufSp: 0, GobufPc: 8, GobufBp: 48, G_stackHi: 8}},
	// gobuf lost its ret field in 1.25: eight bytes less in m before curg, in g before
	// atomicstatus.
	{25, KernelGoRuntime{G_m: 48, G_sched: 56, M_curg: 184, G_status: 144, GobufSp: 0, GobufPc: 8, GobufBp: 40, G_stackHi: 8}},
}

// goMinorMax is the newest release goLayouts is known to hold for; a later one needs DWARF.
// TestGoLayoutsMatchDWARF fails on a toolchain newer than this: add its layout then.
const goMinorMax = 26

// goFuncRules are the runtime functions a Go table describes, by pclntab name.
var goFuncRules = map[string]GoFunc{
	"runtime.goexit":      GoFuncTop,
	"runtime.mstart":      GoFuncTop,
	"runtime.rt0_go":      GoFuncTop,
	"runtime.mcall":       GoFuncTop,
	"runtime.systemstack": GoFuncSystemstack,
	"runtime.morestack":   GoFuncMorestack,
	"runtime.asmcgocall":  GoFuncAsmcgocall,
	"runtime.cgocallback": GoFuncFPSwitch,
	"runtime.walltime":    GoFuncFPSwitch,
	"runtime.nanotime1":   GoFuncFPSwitch,
	"time.now":            GoFuncFPSwitch, // the assembly of time.Now on linux/amd64
}

// goSPFuncs are the assembly functions a walk passes through that keep no frame pointer:
// cgo's entry from C and the signal trampolines. Their rows come from the pcsp table.
var goSPFuncs = []string{"crosscall2", "runtime.sigtramp", "runtime.cgoSigtramp", "runtime.sigprofNonGoWrapper"}

// goSigreturns are the names Go's signal restorer has had.
var goSigreturns = []string{"runtime.sigreturn__sigaction", "runtime.sigreturn"}

var goVersion = regexp.MustCompile(`go1\.([0-9]+)`)

// goMinor is the minor release of a Go version string, 0 if it cannot be read.
func goMinor(v string) int {
	m := goVersion.FindStringSubmatch(v)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// ReadGoRuntime reads what the walker needs of a Go binary. r is the file f was read
// from, for its build information.
func ReadGoRuntime(f *elf.File, r io.ReaderAt) (*GoRuntime, error) {
	if f.Machine != elf.EM_X86_64 || f.Class != elf.ELFCLASS64 {
		return nil, fmt.Errorf("unwind: go runtime of a %s %s file", f.Class, f.Machine)
	}
	g := &GoRuntime{Version: goVersionOf(r)}
	minor := goMinor(g.Version)
	funcs, err := readGoFuncs(f)
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for name := range goFuncRules {
		want[name] = true
	}
	for _, name := range append(slices.Clone(goSPFuncs), goSigreturns...) {
		want[name] = true
	}
	want[goParkProbe], want[goExecuteProbe] = true, true
	found := funcs.find(want)
	probes, parkAt := goProbes(f, r, found, minor)

	if minor >= 21 {
		// The table of releases first: f.DWARF decompresses every debug section of the
		// binary, tens of megabytes for a large Go program, to read nine offsets.
		if minor <= goMinorMax {
			for _, v := range goLayouts {
				if minor >= v.minor {
					l := v.layout
					g.Layout, g.LayoutSource = &l, "version"
				}
			}
		} else if l, ok := dwarfLayout(f); ok {
			g.Layout, g.LayoutSource = l, "dwarf"
		}
		if g.Layout != nil {
			// asmcgocall keeps the goroutine's stack depth and the goroutine at 0(SP) and
			// 8(SP) on g0 since 1.22, at 40(SP) and 48(SP) before (room for Windows).
			g.Layout.CgoDepth, g.Layout.CgoG = 0, 8
			if minor < 22 {
				g.Layout.CgoDepth, g.Layout.CgoG = 40, 48
			}
			g.Layout.TlsG = tlsOffset(f)
		}
	}

	add := func(fn goFunc, rows []Row) {
		g.Rows = append(g.Rows, rows...)
		g.Rows = append(g.Rows, Row{PC: fn.end}) // the end, filled with what follows
	}
	names := make([]string, 0, len(goFuncRules))
	for name := range goFuncRules {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		fn, ok := found[name]
		kind := goFuncRules[name]
		// Without the layout, the switches through g0 are left to frame pointers: a walk
		// through them may end, but not wrongly.
		needsLayout := kind == GoFuncSystemstack || kind == GoFuncMorestack || kind == GoFuncAsmcgocall
		if !ok || (needsLayout && g.Layout == nil) || minor < 21 {
			continue
		}
		add(fn, []Row{{PC: fn.entry, CFA: CFAGo, CFAReg: uint8(kind)}})
	}
	if probes.Park != 0 {
		// A walk from the park probe starts before gopark's frame pointer is set: the
		// return address is at the stack pointer, the frame pointer still the caller's.
		g.Probes = probes
		add(goFunc{entry: parkAt, end: parkAt + 1}, []Row{{PC: parkAt, CFA: CFASP, CFAOffset: 8, FP: FPUnchanged}})
	}
	for _, name := range goSPFuncs {
		fn, ok := found[name]
		if !ok {
			continue
		}
		if rows, ok := funcs.spDeltas(fn); ok {
			add(fn, rows)
		}
	}
	for _, name := range goSigreturns {
		if fn, ok := found[name]; ok && fn.entry > 0 {
			// The handler returns to the restorer's first byte, which the walker looks up
			// one byte back, as for glibc's __restore_rt.
			add(fn, []Row{{PC: fn.entry - 1, CFA: CFASignal}})
			break
		}
	}
	return g, nil
}

// goVersionOf reads the Go release from a binary's build information; "" where it has
// none, or debug/buildinfo gives up on it.
func goVersionOf(r io.ReaderAt) (v string) {
	defer func() {
		if recover() != nil {
			v = ""
		}
	}()
	if bi, err := buildinfo.Read(r); err == nil {
		return bi.GoVersion
	}
	return ""
}

// tlsOffset is where a thread's g is relative to its thread pointer. Go's internal linker
// uses -8(FS) and gives the binary no TLS segment; an external link puts runtime.tlsg in
// the executable's TLS block, which ends at the thread pointer.
func tlsOffset(f *elf.File) int32 {
	for _, p := range f.Progs {
		if p.Type != elf.PT_TLS {
			continue
		}
		align := max(p.Align, 1)
		size := (p.Memsz + align - 1) / align * align
		if size <= 8 {
			return -8 // g alone: no need to scan the symbol table for it
		}
		at, _, _ := objfile.LookupSymbol(f, "runtime.tlsg") // first in the block where the symbol table is gone
		if size > 1<<20 || at > size {
			return -8
		}
		return int32(int64(at) - int64(size))
	}
	return -8
}

// maxGoDWARF bounds the .debug_info read for the layout; the types sit in the first
// units, and larger sections are left for the version's table.
const maxGoDWARF = 64 << 20

// dwarfLayout reads the runtime's layout from the binary's DWARF.
func dwarfLayout(f *elf.File) (*KernelGoRuntime, bool) {
	s := f.Section(".debug_info")
	if s == nil || s.Size > maxGoDWARF {
		return nil, false
	}
	d, err := dwarfOf(f)
	if err != nil {
		return nil, false
	}
	want := map[string][]string{"runtime.g": {"m", "sched", "stack", "atomicstatus"}, "runtime.m": {"curg"}, "runtime.gobuf": {"sp", "pc", "bp"}, "runtime.stack": {"hi"}}
	got := map[string]int64{}
	r := d.Reader()
	for len(got) < 9 {
		e, err := r.Next()
		if err != nil || e == nil {
			return nil, false
		}
		if e.Tag != dwarf.TagStructType || !e.Children {
			continue
		}
		name, _ := e.Val(dwarf.AttrName).(string)
		fields, ok := want[name]
		if !ok {
			continue
		}
		for {
			c, err := r.Next()
			if err != nil || c == nil {
				return nil, false
			}
			if c.Tag == 0 {
				break
			}
			fn, _ := c.Val(dwarf.AttrName).(string)
			if slices.Contains(fields, fn) {
				if off, ok := c.Val(dwarf.AttrDataMemberLoc).(int64); ok && off >= 0 && off < 1<<16 {
					got[name+"."+fn] = off
				}
			}
			if c.Children {
				r.SkipChildren()
			}
		}
	}
	l := &KernelGoRuntime{
		G_m: uint16(got["runtime.g.m"]), G_sched: uint16(got["runtime.g.sched"]), M_curg: uint16(got["runtime.m.curg"]),
		G_status: uint16(got["runtime.g.atomicstatus"]),
		GobufSp:  uint8(got["runtime.gobuf.sp"]), GobufPc: uint8(got["runtime.gobuf.pc"]), GobufBp: uint8(got["runtime.gobuf.bp"]),
		G_stackHi: uint8(got["runtime.g.stack"] + got["runtime.stack.hi"]),
	}
	for _, v := range []int64{got["runtime.gobuf.sp"], got["runtime.gobuf.pc"], got["runtime.gobuf.bp"], got["runtime.g.stack"] + got["runtime.stack.hi"]} {
		if v > 255 {
			return nil, false
		}
	}
	return l, true
}

// dwarfOf reads f's DWARF, turning a panic of debug/dwarf on hostile input into an error.
func dwarfOf(f *elf.File) (d *dwarf.Data, err error) {
	defer func() {
		if p := recover(); p != nil {
			if mmapfile.Fault(p) != nil {
				panic(p)
			}
			d, err = nil, fmt.Errorf("corrupt dwarf: %v", p)
		}
	}()
	return f.DWARF()
}

// goTable builds a Go binary's table: cgo's C code from .eh_frame (never .debug_frame,
// which covers all of Go's code at great cost), the rest walked by frame pointer, and
// the runtime's functions as g describes them.
func goTable(f *elf.File, g *GoRuntime) (*Table, error) {
	gap := Row{CFA: CFAFramePointer}
	t := &Table{Rows: []Row{gap}, Source: "go"}
	if s := f.Section(".eh_frame"); usable(s) {
		data, err := sectionData(s)
		if err != nil {
			return nil, err
		}
		b := bases{data: sectionAddr(f, ".got"), text: sectionAddr(f, ".text")}
		sec := &frameSection{data: data, addr: s.Addr, bases: b}
		var hdr *ehHdr
		if hs := f.Section(".eh_frame_hdr"); usable(hs) {
			if hd, err := sectionData(hs); err == nil {
				if h, ok := parseHdr(hd, hs.Addr, b.text); ok {
					hdr = &h
				}
			}
		}
		t = buildWithGap(sec, hdr, ".eh_frame", gap)
		t.Source = "go"
	}
	t.Rows = overlay(t.Rows, g.Rows)
	return t, nil
}

// overlay replaces the rows in the ranges seg describes. seg is a list of ranges, each a
// run of rows ending in a row whose rule is CFAInvalid that marks its end: there, the
// rule rows had before is restored.
func overlay(rows, seg []Row) []Row {
	for i := 0; i < len(seg); {
		j := i
		for j < len(seg) && seg[j].CFA != CFAInvalid {
			j++
		}
		if j == len(seg) {
			break
		}
		if j > i {
			rows = replaceRange(rows, seg[i:j], seg[i].PC, seg[j].PC)
		}
		i = j + 1
	}
	return rows
}

// replaceRange puts with's rows in place of rows' in [start, end). rows are sorted by
// PC. It works in place, within rows' capacity where it can: a large binary's table (node's
// is half a million rows) is not copied for a range of a few rows.
func replaceRange(rows, with []Row, start, end uint64) []Row {
	if end <= start {
		return rows
	}
	first, past := len(rows), len(rows) // rows from first up to past lie in [start, end]
	for i, r := range rows {
		if r.PC >= start && first == len(rows) {
			first = i
		}
		if r.PC > end {
			past = i
			break
		}
	}
	first = min(first, past)
	after := Row{} // the rule in effect at end
	if past > 0 {
		after = rows[past-1]
	}
	mid := make([]Row, 0, len(with)+1)
	for _, r := range with {
		if r.PC >= start && r.PC < end {
			mid = append(mid, r.normal())
		}
	}
	after.PC = end
	mid = append(mid, after)
	rows = slices.Replace(rows, first, past, mid...)
	// Merge what the replacement made equal.
	merged := rows[:0]
	for _, r := range rows {
		if n := len(merged); n > 0 && merged[n-1].PC == r.PC {
			// The later row wins the address, and may take the rule of the one before.
			if n > 1 && sameRule(merged[n-2], r) {
				merged = merged[:n-1]
			} else {
				merged[n-1] = r
			}
			continue
		}
		if n := len(merged); n > 0 && sameRule(merged[n-1], r) {
			continue
		}
		merged = append(merged, r)
	}
	return merged
}
