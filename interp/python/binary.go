package python

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/unwind"
)

// Interpreter is what an interpreter file tells: its version, its layout, and where its
// runtime state and eval loop are, as ELF virtual addresses.
type Interpreter struct {
	Version Version
	Layout  Layout
	// Runtime is _PyRuntime's address.
	Runtime uint64
	// Eval is _PyEval_EvalFrameDefault's [start, end); EvalCold its part the compiler
	// moved out of line (gcc's .cold), or zero.
	Eval, EvalCold [2]uint64
	// CodeType and UnicodeType are PyCode_Type's and PyUnicode_Type's addresses, which
	// the ob_type of a code object and of a string must hold.
	CodeType, UnicodeType, BytesType uint64
	// InitShim is the address of the code object 3.13+ runs between a class's
	// instantiation and its __init__, or 0 where the file does not show it.
	InitShim uint64
	// loads are the file's loadable segments, which place its mappings.
	loads objfile.Loads
}

// Bias returns the load bias (runtime address - ELF address) of the interpreter mapped at
// start from file offset offset.
func (in *Interpreter) Bias(start, offset uint64) (uint64, bool) { return in.loads.Bias(start, offset) }

// ErrNotPython: the file is not a CPython interpreter.
var ErrNotPython = errors.New("not a CPython interpreter")

// maxRuntimeRead bounds what is read of _PyRuntime's initial value in the file.
const maxRuntimeRead = debugOffsetsSize

// Inspect tells whether an ELF file is a CPython interpreter and, if it is, how to walk
// and name its frames. Most files are not: they are told apart by their dynamic symbols,
// which an interpreter exports for its extension modules, before anything else is read.
func Inspect(f *elf.File) (in *Interpreter, err error) {
	// debug/elf and debug/dwarf panic on some corrupt inputs.
	defer func() {
		if p := recover(); p != nil {
			in, err = nil, fmt.Errorf("inspect interpreter: corrupt file: %v", p)
		}
	}()
	// Every library a process maps is asked: the table is scanned in place, not listed
	// with a string per symbol (megabytes for a JVM's or node's).
	syms, err := objfile.OpenSymbols(f, elf.SHT_DYNSYM)
	if err != nil {
		return nil, fmt.Errorf("read dynamic symbols: %w", err)
	}
	want := map[string]*elf.Symbol{"_PyRuntime": nil, "_PyEval_EvalFrameDefault": nil, "PyCode_Type": nil,
		"PyUnicode_Type": nil, "PyBytes_Type": nil, "Py_Version": nil, "_Py_RefTotal": nil}
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
	runtime, eval := want["_PyRuntime"], want["_PyEval_EvalFrameDefault"]
	if runtime == nil || eval == nil || eval.Size == 0 {
		return nil, ErrNotPython
	}
	for _, name := range []string{"PyCode_Type", "PyUnicode_Type", "PyBytes_Type"} {
		if want[name] == nil {
			return nil, fmt.Errorf("interpreter without %s", name)
		}
	}
	in = &Interpreter{
		Runtime:     runtime.Value,
		Eval:        [2]uint64{eval.Value, eval.Value + eval.Size},
		CodeType:    want["PyCode_Type"].Value,
		UnicodeType: want["PyUnicode_Type"].Value,
		BytesType:   want["PyBytes_Type"].Value,
	}
	in.loads = objfile.LoadsOf(f)
	if s, ok, _ := objfile.FindSymbol(f, elf.SHT_SYMTAB, "_PyEval_EvalFrameDefault.cold", true); ok && s.Value != 0 && s.Size > 0 {
		in.EvalCold = [2]uint64{s.Value, s.Value + s.Size}
	} else if f.Section(".symtab") == nil {
		in.EvalCold = interp.OutOfLinePart(f, in.Eval[0], in.Eval[1], func() *unwind.Table {
			t, _ := unwind.FromELF(f)
			return t
		})
	}
	head, _ := objfile.ReadVaddr(f, runtime.Value, maxRuntimeRead)
	if bytes.HasPrefix(head, debugOffsetsCookie) {
		if in.Version, in.Layout, err = parseDebugOffsets(head); err != nil {
			return nil, err
		}
		in.InitShim = initShim(f, in)
		return in, nil
	}
	if in.Version, err = fileVersion(f, want["Py_Version"]); err != nil {
		return nil, err
	}
	if in.Version.Minor < MinMinor || in.Version.Minor > MaxMinor || in.Version.Major != 3 {
		return nil, fmt.Errorf("python %s: %w", in.Version, ErrUnsupported)
	}
	// A release build has its version's layout (TestInspect checks DWARF against the
	// table for every interpreter installed). A debug build (Py_REF_DEBUG, which
	// exports _Py_RefTotal) may add fields, and is read from its DWARF: debug/dwarf
	// parses all of it, tens of MB for a libpython with debug information, which a
	// release build is spared.
	if want["_Py_RefTotal"] != nil {
		if d, derr := f.DWARF(); derr == nil {
			if l, lerr := dwarfLayout(d, in.Version); lerr == nil {
				in.Layout = l
				return in, nil
			}
		}
	}
	if in.Layout, err = tableLayout(in.Version); err != nil {
		return nil, err
	}
	in.InitShim = initShim(f, in)
	return in, nil
}

// initShimSymbol is the static code object of the __init__ shim (3.13+): a local symbol
// in 3.13, exported since 3.14.
const initShimSymbol = "_Py_InitCleanup"

// maxShimScan bounds each data section read in search of the shim (a few MB).
const maxShimScan = 8 << 20

// initShim finds the __init__ shim's code object, so that its frames are left out from a
// process's first sample rather than from when the namer first meets one. Where no
// symbol names it (Debian's stripped 3.13), it is the one static code object with no
// first line, read from the file's data as the process first sees it.
func initShim(f *elf.File, in *Interpreter) uint64 {
	if !in.Version.AtLeast(13) {
		return 0
	}
	for _, typ := range []elf.SectionType{elf.SHT_DYNSYM, elf.SHT_SYMTAB} {
		if s, ok, _ := objfile.FindSymbol(f, typ, initShimSymbol, true); ok && s.Value != 0 {
			return s.Value
		}
	}
	return scanInitShim(f, in)
}

// scanInitShim looks through a file's data for the static code object with no first line.
// A position-independent file may hold zero where the process will have a pointer, set by
// a dynamic relocation: the file is read as relocated at bias 0.
func scanInitShim(f *elf.File, in *Interpreter) uint64 {
	img := NewImage(in, 0)
	file := fileMemory{f, objfile.ReadRelocations(f, true)}
	var found uint64
	unique := true
	try := func(typeAt uint64) {
		addr := typeAt - uint64(in.Layout.ObType)
		if c, err := img.ReadCode(file, addr); err == nil && c.FirstLine == 0 && addr != found {
			unique = found == 0
			found = addr
		}
	}
	file.rel.Each(func(at, value uint64) bool {
		if value == in.CodeType {
			try(at)
		}
		return unique
	})
	for _, sec := range f.Sections {
		if !unique || sec.Type != elf.SHT_PROGBITS || sec.Flags&elf.SHF_ALLOC == 0 || sec.Flags&elf.SHF_EXECINSTR != 0 {
			continue
		}
		b, err := objfile.SectionData(sec, maxShimScan)
		if err != nil {
			continue
		}
		// Objects, and so their ob_type, are 8-aligned.
		ob := in.Layout.ObType
		for off := ob + int(-(sec.Addr+uint64(ob))&7); off+8 <= len(b) && unique; off += 8 {
			if binary.LittleEndian.Uint64(b[off:]) == in.CodeType {
				try(sec.Addr + uint64(off))
			}
		}
		objfile.GiveBack(sec, b)
	}
	if !unique {
		return 0 // two: neither is known to be the shim
	}
	return found
}

// fileMemory reads an ELF file's initial data by virtual address, as a process mapping it
// at bias 0 sees it once the loader has relocated it.
type fileMemory struct {
	f   *elf.File
	rel *objfile.Relocations
}

func (m fileMemory) ReadAt(p []byte, addr uint64) error {
	b, err := objfile.ReadVaddr(m.f, addr, uint64(len(p)))
	if err != nil {
		return err
	}
	if len(b) < len(p) {
		return fmt.Errorf("read %#x: %d of %d bytes in the file", addr, len(b), len(p))
	}
	copy(p, b)
	m.rel.Apply(p, addr, m.f.ByteOrder)
	return nil
}

// fileVersion reads the interpreter's exact version: Py_Version (PY_VERSION_HEX) since
// 3.11, else the version string the file keeps for sys.version.
func fileVersion(f *elf.File, pyVersion *elf.Symbol) (Version, error) {
	if pyVersion != nil {
		if b, err := objfile.ReadVaddr(f, pyVersion.Value, 4); err == nil && len(b) == 4 {
			hex := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
			return Version{Major: int(hex >> 24), Minor: int(hex >> 16 & 0xff), Micro: int(hex >> 8 & 0xff)}, nil
		}
	}
	sec := f.Section(".rodata")
	if sec == nil {
		return Version{}, errors.New("interpreter without .rodata: no version")
	}
	data, err := objfile.SectionData(sec, 64<<20)
	if err != nil {
		return Version{}, fmt.Errorf("read .rodata: %w", err)
	}
	return versionIn(data)
}

// versionPattern matches PY_VERSION where the compiler kept it, possibly as the tail of
// a longer string ("…/Python-3.9.18"): the most frequent match wins.
var versionPattern = regexp.MustCompile(`3\.(\d{1,2})\.(\d{1,2})(?:[abc]\d+|rc\d+|\+)?\x00`)

func versionIn(data []byte) (Version, error) {
	counts := map[Version]int{}
	var best Version
	for _, m := range versionPattern.FindAllSubmatch(data, 1000) {
		minor, _ := strconv.Atoi(string(m[1]))
		micro, _ := strconv.Atoi(string(m[2]))
		v := Version{Major: 3, Minor: minor, Micro: micro}
		counts[v]++
		if counts[v] > counts[best] {
			best = v
		}
	}
	if counts[best] == 0 {
		return Version{}, errors.New("no version string in .rodata")
	}
	return best, nil
}
