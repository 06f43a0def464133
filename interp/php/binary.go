package php

import (
	"debug/elf"
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"golang.org/x/arch/x86/x86asm"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/unwind"
)

// Engine is what a file holding the Zend engine tells: its version, its layout, and where
// its executor's state and loop are, as ELF virtual addresses.
type Engine struct {
	Version Version
	Layout  Layout
	// Globals is executor_globals' address.
	Globals uint64
	// Exec is execute_ex's [start, end); ExecCold its part the compiler moved out of line
	// (gcc's execute_ex.cold, its rarely run handlers), or zero.
	Exec, ExecCold [2]uint64
	// Frame is execute_ex's frame where its body runs, on which opcache's JIT code runs
	// too; zero where it was not found (no JIT frames are walked then).
	Frame ExecFrame
	// loads are the file's loadable segments, which place its mappings.
	loads objfile.Loads
}

// Bias returns the load bias (runtime address - ELF address) of the engine mapped at start
// from file offset offset.
func (e *Engine) Bias(start, offset uint64) (uint64, bool) { return e.loads.Bias(start, offset) }

// ErrNotPHP: the file is not a Zend engine.
var ErrNotPHP = errors.New("not a php engine")

// Inspect tells whether an ELF file holds the Zend engine and, if it does, how to walk and
// name its frames. Most files do not: they are told apart by their dynamic symbols, which
// the engine exports for its extensions, before anything else is read.
func Inspect(f *elf.File) (e *Engine, err error) {
	defer func() {
		if p := recover(); p != nil {
			e, err = nil, fmt.Errorf("inspect php engine: corrupt file: %v", p)
		}
	}()
	syms, err := objfile.OpenSymbols(f, elf.SHT_DYNSYM)
	if err != nil {
		return nil, fmt.Errorf("read dynamic symbols: %w", err)
	}
	want := map[string]*elf.Symbol{"execute_ex": nil, "executor_globals": nil, "executor_globals_offset": nil,
		"zend_is_executing": nil, "zend_get_executed_filename_ex": nil}
	if syms != nil {
		syms.Each(func(i int, name []byte) bool {
			if _, ok := want[string(name)]; ok {
				if s := syms.Elf(i); s.Section != elf.SHN_UNDEF && s.Value != 0 {
					want[s.Name] = &s
				}
			}
			return true
		})
	}
	exec := want["execute_ex"]
	if exec == nil || exec.Size == 0 || (want["executor_globals"] == nil && want["executor_globals_offset"] == nil) {
		return nil, ErrNotPHP
	}
	rodata := f.Section(".rodata")
	if rodata == nil {
		return nil, errors.New("php engine without .rodata: no version")
	}
	data, err := objfile.SectionData(rodata, 64<<20)
	if err != nil {
		return nil, fmt.Errorf("read .rodata: %w", err)
	}
	defer objfile.GiveBack(rodata, data)
	e = &Engine{Exec: [2]uint64{exec.Value, exec.Value + exec.Size}, loads: objfile.LoadsOf(f)}
	var threadSafe bool
	if e.Version, threadSafe, err = versionIn(data); err != nil {
		return nil, err
	}
	if threadSafe || want["executor_globals"] == nil {
		return nil, fmt.Errorf("php %s: %w: a thread-safe (ZTS) build keeps its executor per thread", e.Version, ErrUnsupported)
	}
	e.Globals = want["executor_globals"].Value
	if e.Layout, err = tableLayout(e.Version); err != nil {
		return nil, err
	}
	if err := checkLayout(f, e, want["zend_is_executing"], want["zend_get_executed_filename_ex"]); err != nil {
		return nil, err
	}
	// One unwind table serves both, built only for a file that holds the engine.
	var table *unwind.Table
	tableOf := func() *unwind.Table {
		if table == nil {
			table, _ = unwind.FromELF(f)
		}
		return table
	}
	if s, ok, _ := objfile.FindSymbol(f, elf.SHT_SYMTAB, "execute_ex.cold", true); ok && s.Value != 0 && s.Size > 0 {
		e.ExecCold = [2]uint64{s.Value, s.Value + s.Size}
	} else if f.Section(".symtab") == nil {
		e.ExecCold = interp.OutOfLinePart(f, e.Exec[0], e.Exec[1], tableOf)
	}
	e.Frame = execFrame(f, tableOf(), e.Exec[0], e.Exec[1])
	return e, nil
}

// The engine's extension API number names its minor release and whether it is thread-safe
// (ZEND_MODULE_BUILD_ID, which every build keeps to check extensions against); the
// X-Powered-By header's text gives the release.
var (
	apiPattern     = regexp.MustCompile(`API(20\d{6}),(NTS|TS)`)
	releasePattern = regexp.MustCompile(`PHP/(\d)\.(\d{1,2})\.(\d{1,3})`)
	apiMinors      = map[string]int{"20200930": 0, "20210902": 1, "20220829": 2, "20230831": 3, "20240924": 4, "20250925": 5}
)

func versionIn(rodata []byte) (v Version, threadSafe bool, err error) {
	api := apiPattern.FindSubmatch(rodata)
	if api == nil {
		return Version{}, false, errors.New("php engine without its API number")
	}
	minor, known := apiMinors[string(api[1])]
	threadSafe = string(api[2]) == "TS"
	if m := releasePattern.FindSubmatch(rodata); m != nil {
		major, _ := strconv.Atoi(string(m[1]))
		mi, _ := strconv.Atoi(string(m[2]))
		micro, _ := strconv.Atoi(string(m[3]))
		v = Version{major, mi, micro}
		if known && (major != 8 || mi != minor) {
			return v, threadSafe, fmt.Errorf("php %s with the API number of 8.%d", v, minor)
		}
		return v, threadSafe, nil
	}
	if !known {
		return Version{}, threadSafe, fmt.Errorf("php engine of API %s: %w", api[1], ErrUnsupported)
	}
	return Version{Major: 8, Minor: minor}, threadSafe, nil
}

// checkLayout holds the table's offsets that differ between releases to the file's own
// code: zend_is_executing compares executor_globals.current_execute_data with NULL, and
// zend_get_executed_filename_ex returns an op array's filename. An offset the table leaves
// to the code must be found there; one the table holds must agree with what is found.
func checkLayout(f *elf.File, e *Engine, isExecuting, filename *elf.Symbol) error {
	if f.Machine != elf.EM_X86_64 {
		if e.Layout.CurrentExecuteData == fromCode {
			return fmt.Errorf("php %s: %w on %s", e.Version, ErrUnsupported, f.Machine)
		}
		return nil
	}
	var at uint64
	if isExecuting != nil {
		at = isExecuting.Value
	}
	current, ok := globalsOffset(code(f, isExecuting), at, e.Globals)
	switch {
	case ok && e.Layout.CurrentExecuteData == fromCode:
		e.Layout.CurrentExecuteData = current
	case ok && current != e.Layout.CurrentExecuteData:
		return fmt.Errorf("php %s: %w: its executor globals keep the current frame at %d, sonde's table at %d",
			e.Version, ErrUnsupported, current, e.Layout.CurrentExecuteData)
	case !ok && e.Layout.CurrentExecuteData == fromCode:
		return fmt.Errorf("php %s: %w: the current frame's place in executor_globals not found", e.Version, ErrUnsupported)
	}
	if filename == nil {
		return nil
	}
	if off, ok := returnedField(code(f, filename), filename.Value, e.Layout.ExFunc, e.Layout.ExPrev); ok && off != e.Layout.OpArrayFilename {
		return fmt.Errorf("php %s: %w: its op arrays keep their file at %d, sonde's table at %d",
			e.Version, ErrUnsupported, off, e.Layout.OpArrayFilename)
	}
	return nil
}

// maxDecode bounds the bytes of a function decoded to check the layout.
const maxDecode = 4096

// code returns the bytes of a small function of the file.
func code(f *elf.File, s *elf.Symbol) []byte {
	if s == nil || s.Size == 0 || s.Size > maxDecode {
		return nil
	}
	b, _ := objfile.ReadVaddr(f, s.Value, s.Size)
	return b
}

// globalsOffset finds the offset into executor_globals of the word zend_is_executing
// compares with NULL, in its code at addr: addressed from a register loaded with
// executor_globals' address, or RIP-relative at executor_globals plus the offset.
func globalsOffset(code []byte, addr, globals uint64) (off int, found bool) {
	based := map[x86asm.Reg]bool{}
	interp.DecodeX86(code, addr, func(in x86asm.Inst, next uint64) bool {
		if in.Op == x86asm.LEA {
			if r, ok := in.Args[0].(x86asm.Reg); ok {
				m, isMem := in.Args[1].(x86asm.Mem)
				based[r] = isMem && m.Base == x86asm.RIP && uint64(int64(next)+m.Disp) == globals
			}
			return true
		}
		if in.Op != x86asm.CMP && in.Op != x86asm.MOV {
			return true
		}
		for _, a := range in.Args {
			m, ok := a.(x86asm.Mem)
			if !ok || m.Index != 0 {
				continue
			}
			switch {
			case m.Base == x86asm.RIP:
				if at := uint64(int64(next) + m.Disp); at >= globals && at < globals+maxGlobalsOffset {
					off, found = int(at-globals), true
					return false
				}
			case based[m.Base] && m.Disp > 0 && m.Disp < maxGlobalsOffset:
				off, found = int(m.Disp), true
				return false
			}
		}
		return true
	})
	return off, found
}

// maxGlobalsOffset bounds an offset into executor_globals (1 800 bytes in 8.2).
const maxGlobalsOffset = 1 << 12

// returnedField finds, in a function's code at addr, the offset of the field it returns
// last from a pointer: "mov disp(reg), %rax; ret", with a displacement that is none of the
// executor frame's (func, prev_execute_data), which its walk to the frame reads.
func returnedField(code []byte, addr uint64, exFunc, exPrev int) (off int, found bool) {
	var prev x86asm.Inst
	interp.DecodeX86(code, addr, func(in x86asm.Inst, _ uint64) bool {
		if in.Op == x86asm.RET && prev.Op == x86asm.MOV && prev.Args[0] == x86asm.RAX {
			if m, ok := prev.Args[1].(x86asm.Mem); ok && m.Base != x86asm.RIP && m.Base != 0 && m.Index == 0 &&
				m.Disp > 0 && m.Disp < 1024 && int(m.Disp) != exFunc && int(m.Disp) != exPrev {
				off, found = int(m.Disp), true
			}
		}
		prev = in
		return true
	})
	return off, found
}
