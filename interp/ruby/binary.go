package ruby

import (
	"debug/elf"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"

	"golang.org/x/arch/x86/x86asm"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/tracectx"
	"github.com/sonde-profiler/sonde/unwind"
)

// VM is what a file holding CRuby tells: its version, its layout, where its VM loop is
// (ELF virtual addresses), and how it reaches ruby_current_ec.
type VM struct {
	Version Version
	Layout  Layout
	// Exec is vm_exec's [start, end) (rb_vm_exec before 3.3), whose frame stands for an
	// activation of the VM; Loop is vm_exec_core's, the loop it calls, and LoopCold the
	// loop's out-of-line part, or zero.
	Exec, Loop, LoopCold [2]uint64
	// EC is how the file reaches ruby_current_ec, each thread's execution context.
	EC *tracectx.TLSSymbol
	// Symbols is ruby_global_symbols' address, 0 where rb_id2str does not show it, and
	// LastOpID the highest ID that is its own serial: they name C methods and, in 3.1,
	// classes.
	Symbols, LastOpID uint64
	// YJIT says the VM was built with YJIT, whose code the native walk meets.
	YJIT  bool
	loads objfile.Loads
}

// Bias returns the load bias of the file mapped at start from file offset offset.
func (v *VM) Bias(start, offset uint64) (uint64, bool) { return v.loads.Bias(start, offset) }

// ErrNotRuby: the file is not CRuby.
var ErrNotRuby = errors.New("not a ruby vm")

// yjitSymbol is a function a VM built with YJIT exports (yjit.c); one without has none.
const yjitSymbol = "rb_yjit_init"

// ecSymbol is the TLS variable holding a thread's execution context.
const ecSymbol = "ruby_current_ec"

// minLoop bounds vm_exec_core from below: the VM's instructions, inlined, are tens of
// kilobytes; what else rb_vm_exec branches to is far smaller.
const minLoop = 4096

// Inspect tells whether an ELF file holds CRuby and, if it does, how to walk and name its
// frames. Most files do not: they are told apart by their dynamic symbols first.
func Inspect(f *elf.File) (v *VM, err error) {
	defer func() {
		if p := recover(); p != nil {
			v, err = nil, fmt.Errorf("inspect ruby: corrupt file: %v", p)
		}
	}()
	syms, err := objfile.OpenSymbols(f, elf.SHT_DYNSYM)
	if err != nil {
		return nil, fmt.Errorf("read dynamic symbols: %w", err)
	}
	// 3.3 and later export neither rb_vm_exec nor ruby_current_ec: rb_iseq_eval, which
	// they keep, reads the one and calls the other's caller.
	want := map[string]*elf.Symbol{"rb_vm_exec": nil, "rb_iseq_eval": nil, "ruby_version": nil, ecSymbol: nil, yjitSymbol: nil}
	if syms != nil {
		syms.Each(func(i int, name []byte) bool {
			if _, ok := want[string(name)]; ok {
				if s := syms.Elf(i); s.Section != elf.SHN_UNDEF {
					want[s.Name] = &s
				}
			}
			return true
		})
	}
	exec, eval, version := want["rb_vm_exec"], want["rb_iseq_eval"], want["ruby_version"]
	entry, depth := exec, 1
	if entry == nil || entry.Value == 0 || entry.Size == 0 {
		entry, depth = eval, 2
	}
	if entry == nil || entry.Value == 0 || entry.Size == 0 || version == nil {
		return nil, ErrNotRuby
	}
	v = &VM{loads: objfile.LoadsOf(f)}
	b, err := objfile.ReadVaddr(f, version.Value, min(version.Size, 32))
	if err != nil {
		return nil, fmt.Errorf("read ruby_version: %w", err)
	}
	if v.Version, err = parseVersion(b); err != nil {
		return nil, err
	}
	if v.Layout, err = tableLayout(v.Version); err != nil {
		return nil, err
	}
	if f.Machine != elf.EM_X86_64 {
		return nil, fmt.Errorf("ruby %s: %w on %s", v.Version, ErrUnsupported, f.Machine)
	}
	if want[ecSymbol] != nil {
		if v.EC, err = tracectx.FindTLSVariable(f, ecSymbol); err != nil || v.EC == nil {
			return nil, fmt.Errorf("ruby %s: %w: %s: %v", v.Version, ErrUnsupported, ecSymbol, err)
		}
	} else if v.EC = ecFromCode(f, eval); v.EC == nil {
		return nil, fmt.Errorf("ruby %s: %w: %s is hidden, and rb_iseq_eval does not show where", v.Version, ErrUnsupported, ecSymbol)
	}
	var table *unwind.Table
	tableOf := func() *unwind.Table {
		if table == nil {
			table, _ = unwind.FromELF(f)
		}
		return table
	}
	if v.Exec, v.Loop = vmLoop(f, entry, depth); v.Loop[1] == 0 {
		return nil, fmt.Errorf("ruby %s: %w: vm_exec_core not found from %s", v.Version, ErrUnsupported, entry.Name)
	}
	v.LoopCold = interp.OutOfLinePart(f, v.Loop[0], v.Loop[1], tableOf)
	v.Symbols, v.LastOpID = globalSymbols(f)
	v.YJIT = want[yjitSymbol] != nil
	return v, nil
}

var versionPattern = regexp.MustCompile(`^(\d)\.(\d{1,2})\.(\d{1,3})`)

func parseVersion(b []byte) (Version, error) {
	m := versionPattern.FindSubmatch(b)
	if m == nil {
		return Version{}, fmt.Errorf("ruby_version %q: not a version", b)
	}
	major, _ := strconv.Atoi(string(m[1]))
	minor, _ := strconv.Atoi(string(m[2]))
	micro, _ := strconv.Atoi(string(m[3]))
	return Version{major, minor, micro}, nil
}

// maxExecRead bounds the bytes of a function decoded on the way to vm_exec_core.
const maxExecRead = 1 << 16

// vmLoop finds vm_exec_core, the largest function (by its FDE), at least minLoop bytes,
// that entry branches to, or (depth 2) that those branch to, and the function that calls
// it: rb_vm_exec calls it; 3.3's rb_iseq_eval calls vm_exec, which does.
func vmLoop(f *elf.File, entry *elf.Symbol, depth int) (caller, loop [2]uint64) {
	ranges, err := unwind.FunctionRanges(f)
	if err != nil {
		return caller, loop
	}
	var best, bestCaller unwind.CodeRange
	seen := map[uint64]bool{}
	level := []unwind.CodeRange{{Start: entry.Value, End: entry.Value + entry.Size}}
	for d := 0; d < depth && len(level) > 0; d++ {
		var next []unwind.CodeRange
		for _, fn := range level {
			if fn.End-fn.Start > maxExecRead || seen[fn.Start] {
				continue
			}
			seen[fn.Start] = true
			code, err := objfile.ReadVaddr(f, fn.Start, fn.End-fn.Start)
			if err != nil {
				continue
			}
			for _, to := range branchTargets(code, fn.Start) {
				r, ok := unwind.RangeAt(ranges, to)
				if !ok || r.Start != to {
					continue
				}
				if r.End-r.Start > best.End-best.Start {
					best, bestCaller = r, fn
				}
				next = append(next, r)
			}
		}
		level = next
	}
	if best.End-best.Start < minLoop {
		return caller, loop
	}
	return [2]uint64{bestCaller.Start, bestCaller.End}, [2]uint64{best.Start, best.End}
}

// branchTargets are where a function's direct calls and jumps go.
func branchTargets(code []byte, addr uint64) []uint64 {
	var out []uint64
	interp.DecodeX86(code, addr, func(in x86asm.Inst, next uint64) bool {
		if rel, ok := in.Args[0].(x86asm.Rel); ok {
			out = append(out, next+uint64(int64(rel)))
		}
		return true
	})
	return out
}

// ecFromCode finds where a libruby that hides ruby_current_ec keeps it, from rb_iseq_eval,
// which reads it through the local-dynamic model: "lea GOT(%rip), %rdi; call
// __tls_get_addr" gives the module's TLS block, and the load from the result that follows
// reads the variable at its offset in the block. The GOT pair holds the module id. A
// program (not a library: it has an interpreter) reads it at a fixed offset from the
// thread pointer.
func ecFromCode(f *elf.File, eval *elf.Symbol) *tracectx.TLSSymbol {
	if eval == nil || eval.Size == 0 || eval.Size > maxExecRead {
		return nil
	}
	code, err := objfile.ReadVaddr(f, eval.Value, eval.Size)
	if err != nil {
		return nil
	}
	var got uint64
	var found *tracectx.TLSSymbol
	program := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
	state, after := 0, 0 // state 1: the GOT pair loaded into rdi; 2: __tls_get_addr called
	interp.DecodeX86(code, eval.Value, func(in x86asm.Inst, next uint64) bool {
		// A ruby that links the VM into its executable reads it in its static TLS block:
		// "mov %fs:-OFFSET, %reg" (local exec).
		if m, ok := in.Args[1].(x86asm.Mem); ok && program && in.Op == x86asm.MOV && m.Segment == x86asm.FS &&
			m.Base == 0 && m.Index == 0 && m.Disp < 0 && m.Disp > -1<<16 {
			found = &tracectx.TLSSymbol{Access: tracectx.LocalExec, Machine: f.Machine, Offset: m.Disp}
			return false
		}
		switch state {
		case 0, 1:
			if in.Op == x86asm.LEA && in.Args[0] == x86asm.RDI {
				if m, ok := in.Args[1].(x86asm.Mem); ok && m.Base == x86asm.RIP {
					got, state = uint64(int64(next)+m.Disp), 1
					return true
				}
			}
			if state == 1 && in.Op == x86asm.CALL {
				state, after = 2, 0
				return true
			}
			state = 0
		case 2:
			// The block's address is in rax until something writes rax: the first load
			// through it reads the variable.
			if after++; after > 8 {
				state = 0
				return true
			}
			if m, ok := in.Args[1].(x86asm.Mem); ok && in.Op == x86asm.MOV && m.Base == x86asm.RAX && m.Index == 0 && m.Disp >= 0 && m.Disp < 1<<16 {
				found = &tracectx.TLSSymbol{Access: tracectx.GlobalDynamic, Machine: f.Machine, GOT: got, Offset: m.Disp, ModuleOnly: true}
				return false
			}
			if r, ok := in.Args[0].(x86asm.Reg); ok && (r == x86asm.RAX || r == x86asm.EAX) {
				state = 0
			}
		}
		return true
	})
	return found
}
