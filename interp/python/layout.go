package python

import (
	"bytes"
	"debug/dwarf"
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is a CPython release: 3.11.2 is {3, 11, 2}.
type Version struct{ Major, Minor, Micro int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro) }

// AtLeast reports whether v is minor 3.minor or later.
func (v Version) AtLeast(minor int) bool { return v.Major > 3 || v.Major == 3 && v.Minor >= minor }

// noOffset marks a field a version does not have.
const noOffset = -1

// Layout is where a CPython version keeps what sonde reads, in bytes from the start of
// each structure, for x86-64 and arm64 alike (LP64; the structures have no
// architecture-dependent members before these).
type Layout struct {
	// _PyRuntimeState: interpreters.head.
	InterpretersHead int
	// PyInterpreterState: the first thread state (tstate_head, threads.head).
	ThreadsHead int
	// PyThreadState.
	ThreadNext, ThreadID, ThreadFrame int
	// CFrameFrame is _PyCFrame.current_frame for 3.11 and 3.12, whose thread states point
	// at a cframe rather than at the frame; noOffset otherwise.
	CFrameFrame int
	// The frame: PyFrameObject before 3.11, _PyInterpreterFrame since.
	FramePrevious, FrameCode, FrameInstr, FrameOwner, FrameIsEntry int
	// PyCodeObject.
	CodeFirstLine, CodeFilename, CodeName, CodeQualname, CodeLineTable, CodeAdaptive int
	// Strings: sizeof(PyASCIIObject) and sizeof(PyCompactUnicodeObject), after which a
	// compact string's characters start.
	ASCIISize, CompactSize int
	// Object headers: PyObject.ob_type; PyASCIIObject's length and state; a bytes
	// object's size and first byte. A free-threaded build's header is 32 bytes, not 16.
	ObType, UnicodeLength, UnicodeState, BytesSize, BytesData int
	// FreeThreaded: built without the GIL (Py_GIL_DISABLED). Its strings' state has
	// interned as a byte of its own (stateKindShift). Threads other than the first run
	// thread-local copies of the bytecode: the frame's tlbc_index (FrameTLBC) picks the
	// copy among the code object's co_tlbc entries (CodeTLBC); both noOffset in other
	// builds.
	FreeThreaded        bool
	FrameTLBC, CodeTLBC int
	// Source says where the offsets came from: "debug_offsets", "dwarf" or "table".
	Source string
}

// Where every build with the GIL agrees; a free-threaded one publishes its own in
// _Py_DebugOffsets.
const (
	obType        = 8  // PyObject.ob_type
	unicodeLength = 16 // PyASCIIObject.length
	unicodeState  = 32 // PyASCIIObject.state
	bytesSize     = 16 // PyVarObject.ob_size of a bytes object
	bytesData     = 32 // PyBytesObject.ob_sval
	kindShift     = 2  // PyASCIIObject.state.kind, after interned:2
)

// stateKindShift is where PyASCIIObject.state's kind starts (compact and ascii are the
// next bits but three and four): after a 2-bit interned field, or a byte of it in a
// free-threaded build.
func (l *Layout) stateKindShift() int {
	if l.FreeThreaded {
		return 8
	}
	return kindShift
}

// withGILObjects sets the object header offsets every build with the GIL shares.
func (l Layout) withGILObjects() Layout {
	l.ObType, l.UnicodeLength, l.UnicodeState, l.BytesSize, l.BytesData = obType, unicodeLength, unicodeState, bytesSize, bytesData
	l.FrameTLBC, l.CodeTLBC = noOffset, noOffset
	return l
}

// layouts are the layouts of release builds of 3.9 to 3.13, read from their DWARF; a debug
// build (Py_DEBUG, Py_TRACE_REFS) has other ones and is not supported without DWARF.
var layouts = map[int]Layout{
	9: {InterpretersHead: 32, ThreadsHead: 8, ThreadNext: 8, ThreadID: 176, ThreadFrame: 24, CFrameFrame: noOffset,
		FramePrevious: 24, FrameCode: 32, FrameInstr: 104, FrameOwner: noOffset, FrameIsEntry: noOffset,
		CodeFirstLine: 40, CodeFilename: 104, CodeName: 112, CodeQualname: noOffset, CodeLineTable: 120, CodeAdaptive: noOffset,
		ASCIISize: 48, CompactSize: 72},
	10: {InterpretersHead: 32, ThreadsHead: 8, ThreadNext: 8, ThreadID: 176, ThreadFrame: 24, CFrameFrame: noOffset,
		FramePrevious: 24, FrameCode: 32, FrameInstr: 96, FrameOwner: noOffset, FrameIsEntry: noOffset,
		CodeFirstLine: 40, CodeFilename: 104, CodeName: 112, CodeQualname: noOffset, CodeLineTable: 120, CodeAdaptive: noOffset,
		ASCIISize: 48, CompactSize: 72},
	11: {InterpretersHead: 40, ThreadsHead: 16, ThreadNext: 8, ThreadID: 152, ThreadFrame: 56, CFrameFrame: 8,
		FramePrevious: 48, FrameCode: 32, FrameInstr: 56, FrameOwner: 69, FrameIsEntry: 68,
		CodeFirstLine: 72, CodeFilename: 112, CodeName: 120, CodeQualname: 128, CodeLineTable: 136, CodeAdaptive: 184,
		ASCIISize: 48, CompactSize: 72},
	12: {InterpretersHead: 40, ThreadsHead: 72, ThreadNext: 8, ThreadID: 136, ThreadFrame: 56, CFrameFrame: 0,
		FramePrevious: 8, FrameCode: 0, FrameInstr: 56, FrameOwner: 70, FrameIsEntry: noOffset,
		CodeFirstLine: 68, CodeFilename: 112, CodeName: 120, CodeQualname: 128, CodeLineTable: 136, CodeAdaptive: 192,
		ASCIISize: 40, CompactSize: 56},
	13: {InterpretersHead: 632, ThreadsHead: 7344, ThreadNext: 8, ThreadID: 152, ThreadFrame: 72, CFrameFrame: noOffset,
		FramePrevious: 8, FrameCode: 0, FrameInstr: 56, FrameOwner: 70, FrameIsEntry: noOffset,
		CodeFirstLine: 68, CodeFilename: 112, CodeName: 120, CodeQualname: 128, CodeLineTable: 136, CodeAdaptive: 200,
		ASCIISize: 40, CompactSize: 56},
}

// Supported versions: the frame models python.h knows.
const (
	MinMinor = 9
	MaxMinor = 15
)

// tableLayout returns the known layout of a version.
func tableLayout(v Version) (Layout, error) {
	l, ok := layouts[v.Minor]
	if v.Major != 3 || !ok {
		return Layout{}, fmt.Errorf("python %s: %w", v, ErrUnsupported)
	}
	l.Source = "table"
	return l.withGILObjects(), nil
}

// ErrUnsupported: a CPython version whose frames sonde cannot walk.
var ErrUnsupported = errors.New("unsupported version (3.9 to 3.15 are)")

// debugOffsetsCookie starts _Py_DebugOffsets, the first member of _PyRuntime since 3.13.
var debugOffsetsCookie = []byte("xdebugpy")

// debugOffsetsSize is how much of _Py_DebugOffsets parseDebugOffsets reads: up to and
// including the unicode object's offsets in every version it knows (3.15's end at 752).
const debugOffsetsSize = 768

// debugFields says where, in 8-byte words from the start of _Py_DebugOffsets, a version
// keeps each offset sonde reads. The structure grows between minor versions (3.14 added
// fields to the interpreter state, frame and code groups, 3.15 to the thread state and the
// type object), so each version has its own map; facts from CPython's
// Include/internal/pycore_debug_offsets.h of each release, checked against Debian's builds
// (TestInspect, TestCodeObjects). Each group starts with its structure's size, which
// parseDebugOffsets checks the group's offsets against.
type debugFields struct {
	interpretersHead, threadsHead                               int
	threadSize, threadNext, threadFrame, threadID               int
	frameSize, framePrevious, frameCode, frameInstr, frameOwner int
	codeSize, codeFilename, codeName, codeQualname              int
	codeLineTable, codeFirstLine, codeAdaptive                  int
	asciiSize                                                   int
	// Since 3.14 (0: not published): the object header's groups, and the thread-local
	// bytecode's fields, which only a free-threaded build fills in.
	objectSize, obType                        int
	bytesGroup, bytesSize, bytesData          int
	unicodeGroup, unicodeState, unicodeLength int
	frameTLBC, codeTLBC                       int
	// freeThreaded: sonde knows this version's free-threaded build (tested on 3.14t).
	freeThreaded bool
}

var debugOffsetFields = map[int]debugFields{
	13: {interpretersHead: 5, threadsHead: 9,
		threadSize: 19, threadNext: 21, threadFrame: 23, threadID: 24,
		frameSize: 28, framePrevious: 29, frameCode: 30, frameInstr: 31, frameOwner: 33,
		codeSize: 34, codeFilename: 35, codeName: 36, codeQualname: 37, codeLineTable: 38, codeFirstLine: 39, codeAdaptive: 43,
		asciiSize: 70},
	14: {interpretersHead: 5, threadsHead: 9,
		threadSize: 22, threadNext: 24, threadFrame: 26, threadID: 27,
		frameSize: 31, framePrevious: 32, frameCode: 33, frameInstr: 34, frameOwner: 36,
		codeSize: 39, codeFilename: 40, codeName: 41, codeQualname: 42, codeLineTable: 43, codeFirstLine: 44, codeAdaptive: 48,
		asciiSize:  80,
		objectSize: 50, obType: 51, bytesGroup: 74, bytesSize: 75, bytesData: 76, unicodeGroup: 77, unicodeState: 78, unicodeLength: 79,
		frameTLBC: 38, codeTLBC: 49, freeThreaded: true},
	15: {interpretersHead: 5, threadsHead: 9,
		threadSize: 22, threadNext: 24, threadFrame: 26, threadID: 30,
		frameSize: 39, framePrevious: 40, frameCode: 41, frameInstr: 42, frameOwner: 44,
		codeSize: 47, codeFilename: 48, codeName: 49, codeQualname: 50, codeLineTable: 51, codeFirstLine: 52, codeAdaptive: 56,
		asciiSize:  92,
		objectSize: 58, obType: 59, bytesGroup: 86, bytesSize: 87, bytesData: 88, unicodeGroup: 89, unicodeState: 90, unicodeLength: 91,
		frameTLBC: 46, codeTLBC: 57},
}

// parseDebugOffsets reads the offsets an interpreter since 3.13 publishes at the start of
// _PyRuntime. It returns the version they describe too.
func parseDebugOffsets(b []byte) (Version, Layout, error) {
	if len(b) < 24 || !bytes.Equal(b[:8], debugOffsetsCookie) {
		return Version{}, Layout{}, errors.New("no _Py_DebugOffsets at _PyRuntime")
	}
	hex := binary.LittleEndian.Uint64(b[8:])
	v := Version{Major: int(hex >> 24 & 0xff), Minor: int(hex >> 16 & 0xff), Micro: int(hex >> 8 & 0xff)}
	fields, ok := debugOffsetFields[v.Minor]
	if v.Major != 3 || !ok {
		return v, Layout{}, fmt.Errorf("_Py_DebugOffsets of python %s: %w", v, ErrUnsupported)
	}
	freeThreaded := b[16] != 0
	if freeThreaded && !fields.freeThreaded {
		return v, Layout{}, fmt.Errorf("python %s built free-threaded: %w", v, ErrUnsupported)
	}
	u := func(word int) int {
		if (word+1)*8 > len(b) {
			return noOffset
		}
		v := binary.LittleEndian.Uint64(b[word*8:])
		if v > 1<<20 {
			return noOffset // no structure sonde reads is that large: not an offset
		}
		return int(v)
	}
	f := fields
	l := Layout{
		InterpretersHead: u(f.interpretersHead),
		ThreadsHead:      u(f.threadsHead),
		ThreadNext:       u(f.threadNext),
		ThreadFrame:      u(f.threadFrame),
		ThreadID:         u(f.threadID),
		CFrameFrame:      noOffset,
		FramePrevious:    u(f.framePrevious),
		FrameCode:        u(f.frameCode),
		FrameInstr:       u(f.frameInstr),
		FrameOwner:       u(f.frameOwner),
		FrameIsEntry:     noOffset,
		CodeFilename:     u(f.codeFilename),
		CodeName:         u(f.codeName),
		CodeQualname:     u(f.codeQualname),
		CodeLineTable:    u(f.codeLineTable),
		CodeFirstLine:    u(f.codeFirstLine),
		CodeAdaptive:     u(f.codeAdaptive),
		ASCIISize:        u(f.asciiSize),
		Source:           "debug_offsets",
	}.withGILObjects()
	// sizeof(PyCompactUnicodeObject): utf8_length and utf8 follow the ASCII header.
	l.CompactSize = l.ASCIISize + 16
	var groups []offsetGroup
	if f.obType != 0 {
		l.ObType = u(f.obType)
		l.BytesSize, l.BytesData = u(f.bytesSize), u(f.bytesData)
		l.UnicodeState, l.UnicodeLength = u(f.unicodeState), u(f.unicodeLength)
		groups = append(groups,
			offsetGroup{"object header", u(f.objectSize), []int{l.ObType + 8}},
			// A bytes object's size is its header's; its bytes follow.
			offsetGroup{"bytes object", u(f.bytesGroup), []int{l.BytesSize + 8, l.BytesData}},
			offsetGroup{"str object", u(f.unicodeGroup), []int{l.UnicodeState + 4, l.UnicodeLength + 8}},
		)
	}
	if freeThreaded {
		l.FreeThreaded = true
		l.FrameTLBC, l.CodeTLBC = u(f.frameTLBC), u(f.codeTLBC)
		groups = append(groups,
			offsetGroup{"interpreter frame", u(f.frameSize), []int{l.FrameTLBC + 4}},
			offsetGroup{"code object", u(f.codeSize), []int{l.CodeTLBC + 8}},
		)
	}
	// A word read from the wrong place (a patch release that moved a group) shows as an
	// offset past its structure's end.
	for _, g := range append([]offsetGroup{
		{"thread state", u(f.threadSize), []int{l.ThreadNext + 8, l.ThreadFrame + 8, l.ThreadID + 8}},
		{"interpreter frame", u(f.frameSize), []int{l.FramePrevious + 8, l.FrameCode + 8, l.FrameInstr + 8, l.FrameOwner + 1}},
		{"code object", u(f.codeSize), []int{l.CodeFilename + 8, l.CodeName + 8, l.CodeQualname + 8, l.CodeLineTable + 8, l.CodeFirstLine + 4, l.CodeAdaptive}},
		{"str object", l.ASCIISize, []int{l.UnicodeState + 4, l.UnicodeLength + 8}},
	}, groups...) {
		for _, end := range g.ends {
			if g.size <= 0 || end <= 0 || end > g.size {
				return v, Layout{}, fmt.Errorf("_Py_DebugOffsets of python %s: %s offsets beyond its size %d: %w", v, g.name, g.size, ErrUnsupported)
			}
		}
	}
	return v, l, l.check()
}

// offsetGroup is a structure's offsets that must end within its size.
type offsetGroup struct {
	name string
	size int
	ends []int
}

// check refuses a layout with an offset missing or beyond what the kernel reads.
func (l Layout) check() error {
	for name, off := range map[string]int{
		"interpreters.head": l.InterpretersHead, "threads head": l.ThreadsHead, "thread next": l.ThreadNext,
		"thread_id": l.ThreadID, "thread frame": l.ThreadFrame, "frame previous": l.FramePrevious,
		"frame code": l.FrameCode, "frame instruction": l.FrameInstr, "co_firstlineno": l.CodeFirstLine,
		"co_filename": l.CodeFilename, "co_name": l.CodeName, "line table": l.CodeLineTable, "ascii size": l.ASCIISize,
		"ob_type": l.ObType, "str length": l.UnicodeLength, "str state": l.UnicodeState,
		"bytes size": l.BytesSize, "bytes data": l.BytesData,
	} {
		if off < 0 || off >= 1<<16-1 {
			return fmt.Errorf("offset of %s: %d: out of range", name, off)
		}
	}
	for _, off := range []int{l.FramePrevious, l.FrameCode, l.FrameInstr, l.FrameOwner, l.FrameIsEntry, l.FrameTLBC} {
		if off >= 120 {
			return fmt.Errorf("frame field at %d: beyond the %d bytes the kernel reads of a frame", off, 120)
		}
	}
	return nil
}

// dwarfLayout derives a layout from the interpreter's DWARF, where a build kept it: what
// holds for any build of the version, debug builds included. minor picks the members.
func dwarfLayout(d *dwarf.Data, v Version) (Layout, error) {
	structs, err := dwarfStructs(d, "pyruntimestate", "pyinterpreters", "_is", "pythreads", "_ts", "_frame",
		"_PyInterpreterFrame", "_PyCFrame", "PyCodeObject", "PyASCIIObject", "PyCompactUnicodeObject")
	if err != nil {
		return Layout{}, err
	}
	var miss []string
	field := func(st string, path ...string) int {
		t := structs[st]
		off := 0
		for _, name := range path {
			var found *dwarf.StructField
			if t != nil {
				for _, f := range t.Field {
					if f.Name == name {
						found = f
						break
					}
				}
			}
			if found == nil {
				miss = append(miss, st+"."+name)
				return noOffset
			}
			off += int(found.ByteOffset)
			t, _ = found.Type.(*dwarf.StructType)
		}
		return off
	}
	size := func(st string) int {
		if t := structs[st]; t != nil {
			return int(t.ByteSize)
		}
		miss = append(miss, st)
		return noOffset
	}
	l := Layout{
		InterpretersHead: field("pyruntimestate", "interpreters", "head"),
		ThreadNext:       field("_ts", "next"),
		ThreadID:         field("_ts", "thread_id"),
		CFrameFrame:      noOffset,
		FrameOwner:       noOffset,
		FrameIsEntry:     noOffset,
		CodeQualname:     noOffset,
		CodeAdaptive:     noOffset,
		CodeFirstLine:    field("PyCodeObject", "co_firstlineno"),
		CodeFilename:     field("PyCodeObject", "co_filename"),
		CodeName:         field("PyCodeObject", "co_name"),
		ASCIISize:        size("PyASCIIObject"),
		CompactSize:      size("PyCompactUnicodeObject"),
		Source:           "dwarf",
	}.withGILObjects()
	switch {
	case v.AtLeast(11):
		l.ThreadsHead = field("_is", "threads", "head")
		l.FramePrevious = field("_PyInterpreterFrame", "previous")
		l.FrameOwner = field("_PyInterpreterFrame", "owner")
		l.CodeQualname = field("PyCodeObject", "co_qualname")
		l.CodeLineTable = field("PyCodeObject", "co_linetable")
		l.CodeAdaptive = field("PyCodeObject", "co_code_adaptive")
	default:
		l.ThreadsHead = field("_is", "tstate_head")
		l.ThreadFrame = field("_ts", "frame")
		l.FramePrevious = field("_frame", "f_back")
		l.FrameCode = field("_frame", "f_code")
		l.FrameInstr = field("_frame", "f_lasti")
		if v.Minor == 9 {
			l.CodeLineTable = field("PyCodeObject", "co_lnotab")
		} else {
			l.CodeLineTable = field("PyCodeObject", "co_linetable")
		}
	}
	switch {
	case v.AtLeast(13):
		l.ThreadFrame = field("_ts", "current_frame")
		l.FrameCode = field("_PyInterpreterFrame", "f_executable")
		l.FrameInstr = field("_PyInterpreterFrame", "instr_ptr")
	case v.AtLeast(11):
		l.ThreadFrame = field("_ts", "cframe")
		l.CFrameFrame = field("_PyCFrame", "current_frame")
		l.FrameCode = field("_PyInterpreterFrame", "f_code")
		l.FrameInstr = field("_PyInterpreterFrame", "prev_instr")
		if v.Minor == 11 {
			l.FrameIsEntry = field("_PyInterpreterFrame", "is_entry")
		}
	}
	if len(miss) > 0 {
		return Layout{}, fmt.Errorf("python %s debug info lacks %v", v, miss)
	}
	return l, l.check()
}

// dwarfStructs finds the complete definitions of the named structs, bounded by the
// entries a hostile or huge DWARF could make it read.
func dwarfStructs(d *dwarf.Data, names ...string) (map[string]*dwarf.StructType, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]*dwarf.StructType{}
	r := d.Reader()
	for i := 0; i < maxDWARFEntries && len(out) < len(want); i++ {
		e, err := r.Next()
		if err != nil {
			return nil, fmt.Errorf("read debug info: %w", err)
		}
		if e == nil {
			break
		}
		if e.Tag == dwarf.TagCompileUnit {
			continue
		}
		name, _ := e.Val(dwarf.AttrName).(string)
		// Some are typedefs of anonymous structs (PyASCIIObject).
		if (e.Tag != dwarf.TagStructType && e.Tag != dwarf.TagTypedef) || !want[name] || out[name] != nil {
			if e.Children {
				r.SkipChildren()
			}
			continue
		}
		if t, err := d.Type(e.Offset); err == nil {
			if td, ok := t.(*dwarf.TypedefType); ok {
				t = td.Type
			}
			if st, ok := t.(*dwarf.StructType); ok && !st.Incomplete && len(st.Field) > 0 {
				out[name] = st
			}
		}
		if e.Children {
			r.SkipChildren()
		}
	}
	return out, nil
}

// maxDWARFEntries bounds the top-level entries searched: libpython has some hundred
// thousand.
const maxDWARFEntries = 5_000_000
