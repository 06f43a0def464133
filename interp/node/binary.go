package node

import (
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// ErrNotV8: the file holds no V8.
var ErrNotV8 = errors.New("not V8")

// ErrNoMetadata: the file holds V8's builtins but not the postmortem metadata sonde reads
// V8's frames and objects with.
var ErrNoMetadata = errors.New("V8 without postmortem metadata (v8dbg_* symbols)")

// Metadata is what a V8 build says of itself in its v8dbg_* symbols: offsets in bytes
// from an object's (untagged) start or from a frame pointer, instance types, constants.
type Metadata struct {
	// Frames.
	FPContext, FPFunction, FPBytecodeOffset int64
	FPBytecodeArray                         int64
	FrameEntry, FrameConstructEntry         int64
	SmiShift                                int64 // SmiShiftSize + SmiTagSize: where a Smi's value starts
	BytecodeHeader                          int64 // BytecodeArray's data: a frame's bytecode offset counts from the tagged pointer
	// Objects.
	MapInstanceType                            int64
	FixedArrayLength, FixedArrayData           int64
	FunctionShared                             int64
	SFINameOrScopeInfo, SFIScript, SFIFunction int64
	ScriptName, ScriptSource, ScriptLineEnds   int64
	StringLength, SeqChars                     int64
	ConsFirst, ConsSecond                      int64
	SlicedParent, SlicedOffset, ThinActual     int64
	// CodeDeoptData and CodePositions, and SFIFunction, are 0 where the metadata does not
	// name them (V8 12, Node 22): the slots are then told by the types of the objects
	// they hold, among the tagged slots before CodeNamedFrom and SFINameOrScopeInfo.
	CodeDeoptData, CodePositions int64
	CodeNamedFrom                int64 // Code's first field the metadata names
	// BytecodePositions is where a BytecodeArray keeps its source position table; 0: told
	// by type among its tagged slots from BytecodeNamedTo to BytecodeHeader.
	BytecodePositions, BytecodeNamedTo         int64
	InstructionStart                           int64 // InstructionStream: its instructions
	ScopeInfoContextLocals, ScopeInfoFirstVars int64
	DeoptInliningPositions, DeoptLiterals      int64
	DeoptSFI                                   int64
	// SFIWrapperShared is SharedFunctionInfoWrapper's shared_info, which V8 13 keeps in a
	// Code's deoptimization data (trusted space) where V8 12 kept the SharedFunctionInfo
	// itself; 0 in a V8 without wrappers.
	SFIWrapperShared int64
	// Instance types.
	FirstNonString, StringRepMask, StringEncMask       int64
	ConsTag, SlicedTag, ThinTag, OneByteTag            int64
	TypeCode, TypeInstructionStream, TypeBytecodeArray int64
	TypeByteArray, TypeFixedArray, TypeScopeInfo       int64
	TypeSFI, TypeScript, TypeWeakFixedArray            int64
	TypeInterpreterData                                int64
	TypeSFIWrapper                                     int64 // -1 where there is none
	// V8 12's trusted space holds its own kinds of arrays; -1 where there are none.
	TypeTrustedFixedArray, TypeProtectedFixedArray, TypeTrustedByteArray int64
}

// V8 is what a file holding V8 tells.
type V8 struct {
	// Version is V8's (v8::internal::Version: "13.6.233.17"), or "unknown version"; the
	// log line about a V8 whose frames are not named says it.
	Version string
	Meta    Metadata
	// Builtins is the embedded builtins' [start, end), ELF virtual addresses.
	Builtins [2]uint64
	// Interpreter is the interpreter's code among them: its entry trampolines and its
	// bytecode handlers, [start, end) each; zero when the symbols do not tell them.
	Interpreter struct{ Entry, Handlers [2]uint64 }
	// Unnamed says why V8's frames are walked but its functions not named (its metadata
	// lacks what naming reads, or its layout is not one sonde reads): they are named
	// [v8], and counted. Nil: named.
	Unnamed error
	// Filled says, for each field of Meta the v8dbg_* symbols do not give, how it is found
	// instead (fillSlotsByType, fillDefault), by the field's name. V8 11 to 13 lack a few.
	Filled map[string]string
	loads  objfile.Loads
}

// Bias returns the load bias of the file mapped at start from file offset offset.
func (v *V8) Bias(start, offset uint64) (uint64, bool) { return v.loads.Bias(start, offset) }

// fileOffset returns the file offset of an ELF virtual address.
func (v *V8) fileOffset(vaddr uint64) (uint64, bool) {
	for _, p := range v.loads {
		if p.Vaddr <= vaddr && vaddr < p.Vaddr+p.Filesz {
			return vaddr - p.Vaddr + p.Off, true
		}
	}
	return 0, false
}

// Inspect tells whether an ELF file holds V8 and, if it does, reads its metadata.
func Inspect(f *elf.File) (v *V8, err error) {
	defer func() {
		if p := recover(); p != nil {
			v, err = nil, fmt.Errorf("inspect v8: corrupt file: %v", p)
		}
	}()
	// Most files are not V8: its metadata is exported (dynamic symbols), which tells them
	// apart before the larger symbol table is read.
	// The tables are scanned in place: node exports tens of thousands of symbols and
	// holds hundreds of thousands more, which debug/elf would list with a string each.
	dyn, err := objfile.OpenSymbols(f, elf.SHT_DYNSYM)
	if err != nil {
		return nil, fmt.Errorf("read dynamic symbols: %w", err)
	}
	dbg := map[string]elf.Symbol{}
	version := map[string]elf.Symbol{}
	isV8 := false
	if dyn != nil {
		dyn.Each(func(i int, name []byte) bool {
			switch {
			case bytes.HasPrefix(name, []byte("v8dbg_")):
				s := dyn.Elf(i)
				dbg[s.Name[len("v8dbg_"):]] = s
			case bytes.HasPrefix(name, []byte("_ZN2v88internal7Version")):
				s := dyn.Elf(i)
				version[s.Name] = s
				isV8 = isV8 || s.Section != elf.SHN_UNDEF
			case !isV8 && bytes.HasPrefix(name, []byte("_ZN2v88internal")) && dyn.At(i).Section != elf.SHN_UNDEF:
				isV8 = true
			}
			return true
		})
	}
	if len(dbg) == 0 {
		if isV8 {
			return nil, ErrNoMetadata
		}
		return nil, ErrNotV8
	}
	v = &V8{Version: v8Version(f, version)}
	b, err := builtins(f)
	if err != nil {
		return nil, err
	}
	v.Builtins = b.span
	v.Interpreter.Entry, v.Interpreter.Handlers = b.entry, b.handlers
	var missing []string
	get := func(name string) int64 {
		s, ok := dbg[name]
		if !ok {
			missing = append(missing, name)
			return 0
		}
		return symbolValue(f, s)
	}
	// A field's symbol ends in its type, which V8 spells differently from release to
	// release (Object, Tagged_Object_): a field is found by class and name, under any of
	// the names it has had.
	field := func(names ...string) (int64, bool) {
		for _, name := range names {
			prefix := name + "__"
			for sym, s := range dbg {
				if strings.HasPrefix(sym, prefix) && !strings.Contains(sym[len(prefix):], "__") {
					return symbolValue(f, s), true
				}
			}
		}
		return 0, false
	}
	getField := func(names ...string) int64 {
		v, ok := field(names...)
		if !ok {
			missing = append(missing, names[0])
		}
		return v
	}
	typeOr := func(name string) int64 {
		if s, ok := dbg[name]; ok {
			return symbolValue(f, s)
		}
		return -1
	}
	m := &v.Meta
	filled := map[string]string{}
	v.Filled = filled
	var ok bool
	m.FPContext = get("off_fp_context_or_frame_type")
	m.FPFunction = get("off_fp_function")
	m.FPBytecodeOffset = get("off_fp_bytecode_offset")
	m.FPBytecodeArray = get("off_fp_bytecode_array")
	m.FrameEntry = get("frametype_EntryFrame")
	m.FrameConstructEntry = get("frametype_ConstructEntryFrame")
	m.SmiShift = get("SmiShiftSize") + get("SmiValueShift")
	m.MapInstanceType = get("class_Map__instance_type__uint16_t")
	m.FunctionShared = get("class_JSFunction__shared__SharedFunctionInfo")
	m.TypeBytecodeArray = get("type_BytecodeArray__BYTECODE_ARRAY_TYPE")
	// What the kernel walks frames with: without it, V8 is not walked.
	if len(missing) > 0 {
		return nil, fmt.Errorf("v8 metadata without %s: %w", strings.Join(missing, ", "), ErrNoMetadata)
	}
	if ts := symbolValue(f, dbg["TaggedSize"]); ts != 8 {
		return nil, fmt.Errorf("v8 with %d-byte tagged values (pointer compression): not supported", ts)
	}
	if m.SmiShift != 32 {
		return nil, fmt.Errorf("v8 with Smis shifted by %d: not supported", m.SmiShift)
	}
	for _, off := range []int64{m.FPContext, m.FPFunction, m.FPBytecodeOffset, m.FPBytecodeArray} {
		if off < -48 || off > 8 || off%8 != 0 {
			return nil, fmt.Errorf("v8 frame slot at fp%+d: past what the kernel reads", off)
		}
	}
	v.loads = objfile.LoadsOf(f)
	// What functions are named with: without it, V8's frames are walked and named [v8].
	m.BytecodeHeader = get("class_BytecodeArray__data__uintptr_t")
	m.FixedArrayLength = get("class_FixedArrayBase__length__SMI")
	m.FixedArrayData = get("class_FixedArray__data__uintptr_t")
	m.SFINameOrScopeInfo = getField("class_SharedFunctionInfo__name_or_scope_info")
	m.SFIScript = getField("class_SharedFunctionInfo__script_or_debug_info", "class_SharedFunctionInfo__script")
	if m.SFIFunction, ok = field("class_SharedFunctionInfo__function_data"); !ok {
		filled["SFIFunction"] = fillSlotsByType
	}
	m.ScriptName = get("class_Script__name__Object")
	m.ScriptSource = get("class_Script__source__Object")
	m.ScriptLineEnds = get("class_Script__line_ends__Object")
	m.StringLength = get("class_String__length__int32_t")
	m.SeqChars = get("class_SeqOneByteString__chars__char")
	m.ConsFirst = get("class_ConsString__first__String")
	m.ConsSecond = get("class_ConsString__second__String")
	m.SlicedParent = get("class_SlicedString__parent__String")
	m.SlicedOffset = get("class_SlicedString__offset__SMI")
	m.ThinActual = get("class_ThinString__actual__String")
	var deoptOK, positionsOK bool
	m.CodeDeoptData, deoptOK = field("class_Code__deoptimization_data")
	m.CodePositions, positionsOK = field("class_Code__source_position_table")
	if !deoptOK || !positionsOK {
		// V8 12 names neither: they lie among the slots before the first field it names.
		m.CodeDeoptData, m.CodePositions = 0, 0
		filled["CodeDeoptData"], filled["CodePositions"] = fillSlotsByType, fillSlotsByType
		m.CodeNamedFrom = firstField(dbg, f, "class_Code__")
		if m.CodeNamedFrom <= 8 {
			missing = append(missing, "class_Code__deoptimization_data")
		}
	}
	if wrapper, ok := field("class_BytecodeArray__wrapper"); ok {
		// V8 12: the source position table is one of the slots after the wrapper.
		m.BytecodeNamedTo = wrapper + 8
		filled["BytecodePositions"] = fillSlotsByType
	} else {
		m.BytecodePositions = bytecodePositionsOffset
		filled["BytecodePositions"] = fillDefault
	}
	m.InstructionStart = get("class_InstructionStream__instruction_start__uintptr_t")
	m.ScopeInfoContextLocals = get("scopeinfo_idx_ncontextlocals")
	m.ScopeInfoFirstVars = get("scopeinfo_idx_first_vars")
	m.DeoptInliningPositions = get("DeoptimizationDataInliningPositionsIndex")
	m.DeoptLiterals = get("DeoptimizationDataLiteralArrayIndex")
	if s, ok := dbg["DeoptimizationDataWrappedSharedFunctionInfoIndex"]; ok {
		// V8 13: the data holds a wrapper of the function.
		m.DeoptSFI = symbolValue(f, s)
		m.SFIWrapperShared = getField("class_SharedFunctionInfoWrapper__shared_info")
		m.TypeSFIWrapper = get("type_SharedFunctionInfoWrapper__SHARED_FUNCTION_INFO_WRAPPER_TYPE")
	} else {
		m.DeoptSFI = get("DeoptimizationDataSharedFunctionInfoIndex")
		m.TypeSFIWrapper = typeOr("type_SharedFunctionInfoWrapper__SHARED_FUNCTION_INFO_WRAPPER_TYPE")
		if m.TypeSFIWrapper >= 0 {
			m.SFIWrapperShared, _ = field("class_SharedFunctionInfoWrapper__shared_info")
		}
	}
	m.FirstNonString = get("FirstNonstringType")
	m.StringRepMask = get("StringRepresentationMask")
	m.StringEncMask = get("StringEncodingMask")
	m.ConsTag = get("ConsStringTag")
	m.SlicedTag = get("SlicedStringTag")
	m.ThinTag = get("ThinStringTag")
	m.OneByteTag = get("OneByteStringTag")
	m.TypeCode = get("type_Code__CODE_TYPE")
	m.TypeInstructionStream = get("type_InstructionStream__INSTRUCTION_STREAM_TYPE")
	m.TypeByteArray = get("type_ByteArray__BYTE_ARRAY_TYPE")
	m.TypeFixedArray = get("type_FixedArray__FIXED_ARRAY_TYPE")
	m.TypeScopeInfo = get("type_ScopeInfo__SCOPE_INFO_TYPE")
	m.TypeSFI = get("type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE")
	m.TypeScript = get("type_Script__SCRIPT_TYPE")
	m.TypeWeakFixedArray = get("type_WeakFixedArray__WEAK_FIXED_ARRAY_TYPE")
	m.TypeInterpreterData = get("type_InterpreterData__INTERPRETER_DATA_TYPE")
	m.TypeTrustedFixedArray = typeOr("type_TrustedFixedArray__TRUSTED_FIXED_ARRAY_TYPE")
	m.TypeProtectedFixedArray = typeOr("type_ProtectedFixedArray__PROTECTED_FIXED_ARRAY_TYPE")
	m.TypeTrustedByteArray = typeOr("type_TrustedByteArray__TRUSTED_BYTE_ARRAY_TYPE")
	switch {
	case len(missing) > 0:
		v.Unnamed = fmt.Errorf("v8 %s: metadata without %s: %w", v.Version, strings.Join(missing, ", "), ErrNoMetadata)
	case m.InstructionStart < 16 || m.InstructionStart > 64 || m.InstructionStart%8 != 0:
		v.Unnamed = fmt.Errorf("v8 %s: InstructionStream with instructions at %d: not supported", v.Version, m.InstructionStart)
	}
	return v, nil
}

// How a field the metadata does not give is found (V8.Filled).
const (
	// fillSlotsByType: the object's slot holding a value of the field's type, among
	// the tagged slots next to the fields the metadata names; read per object.
	fillSlotsByType = "slots by type"
	// fillDefault: sonde's constant, checked by the type of what it reads.
	fillDefault = "default"
)

// v8Version reads v8::internal::Version's numbers from the file's data.
func v8Version(f *elf.File, syms map[string]elf.Symbol) string {
	var parts []string
	for _, n := range []string{"major", "minor", "build", "patch"} {
		s, ok := syms["_ZN2v88internal7Version"+strconv.Itoa(len(n)+1)+n+"_E"]
		if !ok || s.Section == elf.SHN_UNDEF {
			return "unknown version"
		}
		parts = append(parts, strconv.FormatInt(symbolValue(f, s), 10))
	}
	return strings.Join(parts, ".")
}

// symbolValue reads a v8dbg_ symbol's value: an int of the symbol's size in the file's
// data, zero in .bss.
func symbolValue(f *elf.File, s elf.Symbol) int64 {
	n := s.Size
	if n != 1 && n != 2 && n != 4 && n != 8 {
		n = 4
	}
	if int(s.Section) >= len(f.Sections) || s.Section == elf.SHN_UNDEF {
		return 0
	}
	if sec := f.Sections[s.Section]; sec.Type == elf.SHT_NOBITS {
		return 0
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || s.Value < p.Vaddr || s.Value+n > p.Vaddr+p.Filesz {
			continue
		}
		b, err := objfile.ProgData(p, s.Value-p.Vaddr, n)
		if err != nil || uint64(len(b)) != n {
			return 0
		}
		switch n {
		case 1:
			return int64(int8(b[0]))
		case 2:
			return int64(int16(binary.LittleEndian.Uint16(b)))
		case 4:
			return int64(int32(binary.LittleEndian.Uint32(b)))
		default:
			return int64(binary.LittleEndian.Uint64(b))
		}
	}
	return 0
}

// builtinsLayout is what node's Builtins_* symbols tell of the embedded builtins.
type builtinsLayout struct {
	span      [2]uint64 // all of them
	stackScan uint64    // stackScanTrampoline's address, or 0
	// The interpreter's entry trampolines and its bytecode handlers, or zero.
	entry, handlers [2]uint64
}

// maxBuiltins bounds the builtins listed to find the interpreter's among them: V8 has
// about 2 300; a file with more is no V8's, and its interpreter is not told.
const maxBuiltins = 1 << 15

// Symbols of the interpreter's code: frames there are interpreted functions'.
const (
	entryTrampoline = "Builtins_InterpreterEntryTrampoline"
	// Ldar is a bytecode every V8 has; its handler lies among the others.
	ldarHandler = "Builtins_LdarHandler"
)

// builtins reads the embedded builtins' layout from the file's Builtins_* functions. The
// bytecode handlers (Builtins_<Bytecode>Handler, with Wide and ExtraWide forms) are found
// as the run of *Handler functions, in address order, around Ldar's: V8 lists them
// together and the embedded blob keeps that order; a build that scattered them has no
// run to find, and its interpreted frames are read the slower way.
func builtins(f *elf.File) (b builtinsLayout, err error) {
	syms, err := objfile.OpenSymbols(f, elf.SHT_SYMTAB)
	if err != nil {
		return b, fmt.Errorf("read symbols: %w", err)
	}
	type builtin struct {
		start, end uint64
		handler    bool
		tag        byte // 'e': an entry trampoline; 'l': Ldar's handler
	}
	var list []builtin
	tooMany := false
	if syms != nil {
		syms.Each(func(i int, name []byte) bool {
			if string(name) == stackScanTrampoline {
				if s := syms.At(i); elf.ST_TYPE(s.Info) == elf.STT_FUNC {
					b.stackScan = s.Value
				}
				return true
			}
			if !bytes.HasPrefix(name, []byte("Builtins_")) {
				return true
			}
			s := syms.At(i)
			if s.Value == 0 || elf.ST_TYPE(s.Info) != elf.STT_FUNC {
				return true
			}
			e := builtin{start: s.Value, end: s.Value + max(s.Size, 1), handler: bytes.HasSuffix(name, []byte("Handler"))}
			if b.span[0] == 0 || e.start < b.span[0] {
				b.span[0] = e.start
			}
			b.span[1] = max(b.span[1], e.end)
			if tooMany = tooMany || len(list) == maxBuiltins; tooMany {
				list = nil
				return true
			}
			switch {
			case string(name) == ldarHandler:
				e.tag = 'l'
			case bytes.HasPrefix(name, []byte(entryTrampoline)): // and ...ForProfiling
				e.tag = 'e'
			}
			list = append(list, e)
			return true
		})
	}
	if b.span[0] == 0 {
		return b, errors.New("v8 without Builtins_* symbols: its builtins cannot be told")
	}
	slices.SortFunc(list, func(x, y builtin) int { return cmp.Compare(x.start, y.start) })
	// Each of the two spans is a run of neighbours in address order, so that no other
	// builtin lies within it.
	run := func(at int, in func(builtin) bool) [2]uint64 {
		lo, hi := at, at
		for lo > 0 && in(list[lo-1]) {
			lo--
		}
		for hi+1 < len(list) && in(list[hi+1]) {
			hi++
		}
		return [2]uint64{list[lo].start, list[hi].end}
	}
	if i := slices.IndexFunc(list, func(e builtin) bool { return e.tag == 'l' }); i >= 0 {
		b.handlers = run(i, func(e builtin) bool { return e.handler })
	}
	if i := slices.IndexFunc(list, func(e builtin) bool { return e.tag == 'e' }); i >= 0 {
		b.entry = run(i, func(e builtin) bool { return e.tag == 'e' })
	}
	if b.handlers == [2]uint64{} || b.entry == [2]uint64{} {
		b.entry, b.handlers = [2]uint64{}, [2]uint64{}
	}
	return b, nil
}

// stackScanTrampoline is V8's assembly function that pushes the callee-saved registers
// before its collector scans the stack (heap::base::Stack): every garbage collection on
// the main thread runs under it, and it has no call frame information.
const stackScanTrampoline = "PushAllRegistersAndIterateStack"

// trampolineCode returns the code of stackScanTrampoline at at (x86-64): a local function
// of size 0 in the symbol table, which sets up a frame pointer first (push rbp; mov rbp,
// rsp) and ends at its first ret. The bytes are checked, so that another function of the
// name is not walked by a frame pointer it does not keep.
func trampolineCode(f *elf.File, at uint64) ([2]uint64, bool) {
	if f.Machine != elf.EM_X86_64 || at == 0 {
		return [2]uint64{}, false
	}
	const window = 64
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 || at < p.Vaddr || at+window > p.Vaddr+p.Filesz {
			continue
		}
		b, err := objfile.ProgData(p, at-p.Vaddr, window)
		if err != nil || len(b) != window || !bytes.HasPrefix(b, []byte{0x55, 0x48, 0x89, 0xe5}) {
			return [2]uint64{}, false
		}
		if end := bytes.IndexByte(b, 0xc3); end > 0 {
			return [2]uint64{at, at + uint64(end) + 1}, true
		}
	}
	return [2]uint64{}, false
}

// BuiltinsCode finds, in a file that carries V8's metadata, the code that keeps frame
// pointers and has no call frame information, which the native walk crosses by frame
// pointer (Spec.FramePointerCode): V8's embedded builtins, and the trampoline
// under its collector's stack scan, without which a sample taken in a collection ends
// there, short of the JavaScript that allocated.
func BuiltinsCode(f *elf.File) (ranges [][2]uint64) {
	defer func() {
		if recover() != nil {
			ranges = nil
		}
	}()
	// Any V8 with its metadata: walked by frame pointer even where sonde cannot read the
	// rest of its layout, so that the native frames below its frames stay.
	if !hasDynamicSymbol(f, "v8dbg_off_fp_function") {
		return nil
	}
	b, err := builtins(f)
	if err != nil {
		return nil
	}
	ranges = [][2]uint64{b.span}
	if t, ok := trampolineCode(f, b.stackScan); ok {
		ranges = append(ranges, t)
	}
	return ranges
}

// hasDynamicSymbol tells whether f exports name, scanning .dynsym in place rather than
// building the list of every symbol: most files are not V8.
func hasDynamicSymbol(f *elf.File, name string) bool {
	_, ok, _ := objfile.FindSymbol(f, elf.SHT_DYNSYM, name, false)
	return ok
}

// firstField is the lowest offset of the fields of a class the metadata names (prefix
// "class_Code__"), past its map; 0 if it names none.
func firstField(dbg map[string]elf.Symbol, f *elf.File, prefix string) int64 {
	first := int64(0)
	for name, s := range dbg {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		if off := symbolValue(f, s); off >= 8 && (first == 0 || off < first) {
			first = off
		}
	}
	return first
}
