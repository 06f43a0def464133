package jvm

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
)

// ErrMissing: the tables lack something naming needs; the error names it.
var ErrMissing = errors.New("missing from the JVM's vmStructs")

// Member is a non-static field as the tables give it: its offset in its type and the
// size of its C++ type, which differs between builds (CodeHeap's block length is a
// size_t in JDK 17, a uint32_t in 25; nmethod's compilation level an int, then a u1).
type Member struct {
	Offset uint64
	Size   uint8 // 1, 2, 4 or 8
}

// FrameLayout is where HotSpot's interpreter keeps its state in a frame, in words from
// the frame pointer (negative: below it), as a kernel walker reads it.
type FrameLayout struct {
	SenderSP, LastSP, Method, Locals, BCP int32
	// Derived says the tables published only sender_sp and last_sp (x86_64's do), and the
	// rest follows from last_sp as frame_x86.hpp defines each slot: one word below the
	// previous (method, mirror, mdp, cache, locals, bcp). Only on x86_64: elsewhere the
	// missing slots are an error.
	Derived bool
}

// Layout is what the tables say of the structures sonde reads: offsets and sizes of
// fields, sizes of types, addresses of statics and constants. Every value comes from
// the process's own tables; where builds differ in which fields exist, the Layout says
// which of them it found (CodeBeginIsPointer, HasBlobKind, NMethodImmutable,
// SourceFileInKlass).
type Layout struct {
	// Statics (addresses in the process).
	CodeCacheHeaps, CodeCacheLowBound, CodeCacheHighBound uint64
	// InterpreterCode is AbstractInterpreter::_code, the StubQueue holding the
	// template interpreter's code: a pc in it is an interpreted frame's.
	InterpreterCode                 uint64
	StubQueueBuffer, StubQueueLimit Member
	// versionAddr is Abstract_VM_Version::_vm_major_version's: the compressed streams'
	// encoding changed with JDK 20, and nothing else tells.
	versionAddr uint64

	GrowableArrayLen, GrowableArrayData Member

	CodeHeapMemory, CodeHeapSegmap, CodeHeapLog2SegmentSize Member
	VirtualSpaceLow, VirtualSpaceHigh                       Member
	HeapBlockSize                                           uint64
	HeapBlockLength, HeapBlockUsed                          Member

	BlobName, BlobSize, BlobHeaderSize, BlobFrameSize, BlobFrameComplete Member
	BlobDataOffset                                                       Member
	// BlobCodeBegin is _code_begin (a pointer, JDK 17) or _code_offset (from the blob's
	// start, JDK 23+): CodeBeginIsPointer tells which.
	BlobCodeBegin      Member
	CodeBeginIsPointer bool
	// BlobKind is CodeBlob::_kind where the build has it (JDK 23+), and KindNMethod the
	// value of CodeBlobKind::Nmethod; without it an nmethod is told by its name.
	BlobKind    Member
	HasBlobKind bool
	KindNMethod int64

	NMethodMethod, NMethodCompileID, NMethodCompLevel, NMethodEntryBCI Member
	NMethodScopesPcsOffset                                             Member
	// Where the debug info lies. JDK 17: the scopes data at _scopes_data_begin (a
	// pointer), the PcDescs from _scopes_pcs_offset to _dependencies_offset and the
	// metadata from _metadata_offset to the scopes data, all offsets from the nmethod.
	// JDK 25 (NMethodImmutable): PcDescs and scopes data in the immutable data block
	// (_immutable_data, _scopes_pcs_offset, _scopes_data_offset, _immutable_data_size),
	// the metadata in the mutable data after the relocations (CodeBlob::_mutable_data,
	// _relocation_size, _mutable_data_size).
	NMethodImmutable bool
	// JDK 17
	NMethodScopesDataBegin, NMethodDependenciesOffset, NMethodMetadataOffset Member
	// JDK 25
	NMethodImmutableData, NMethodImmutableDataSize, NMethodScopesDataOffset Member
	BlobMutableData, BlobMutableDataSize, BlobRelocationSize                Member

	PcDescSize                  uint64
	PcDescPcOffset, PcDescScope Member

	MethodConstMethod                                       Member
	MethodSize                                              uint64
	ConstMethodSize                                         uint64
	ConstMethodConstants, ConstMethodFlags, ConstMethodCode Member
	ConstMethodNameIndex, ConstMethodSignatureIndex         Member
	ConstMethodIDNum                                        Member
	HasLineNumberTable                                      int64 // the flag's bit in ConstMethodFlags

	ConstantPoolSize                       uint64
	ConstantPoolHolder, ConstantPoolLength Member
	// ConstantPoolSourceFile is the source file's index into the pool: a field of the
	// pool, or of its class (InstanceKlass) where SourceFileInKlass says so.
	ConstantPoolSourceFile               Member
	SourceFileInKlass                    bool
	KlassName, InstanceKlassMethods      Member
	ArrayMethodsLength, ArrayMethodsData Member
	SymbolLength, SymbolBody             Member
	InvocationEntryBCI                   int64

	Frame FrameLayout
}

// maxStructOffset bounds the offsets and sizes the tables give: HotSpot's largest
// structures are a few KiB.
const maxStructOffset = 1 << 16

// layoutBuilder reads fields out of VMStructs and collects the names it could not find,
// so that one error names all of them.
type layoutBuilder struct {
	vs      *VMStructs
	missing []string
}

func (b *layoutBuilder) has(typ, field string) bool {
	_, ok := b.vs.Fields[typ][field]
	return ok
}

// sizeOf is the size of a field's C++ type: pointers are 8 bytes, named types as the
// type table says.
func (b *layoutBuilder) sizeOf(typeString string) (uint8, bool) {
	if strings.HasSuffix(typeString, "*") || typeString == "address" {
		return 8, true
	}
	// "volatile signed char" and the like: the table lists the type without qualifiers.
	t, ok := b.vs.Types[strings.TrimPrefix(typeString, "volatile ")]
	if !ok {
		return 0, false
	}
	switch t.Size {
	case 1, 2, 4, 8:
		return uint8(t.Size), true
	}
	return 0, false
}

// member finds the first of the names given (alternatives a build may use) of a
// non-static field of typ. Its size is its type's; want, if not zero, overrides it for
// fields whose type is a struct (VirtualSpace inside CodeHeap).
func (b *layoutBuilder) member(typ string, want uint8, fields ...string) Member {
	for _, name := range fields {
		f, ok := b.vs.Fields[typ][name]
		if !ok || f.Static {
			continue
		}
		size := want
		if size == 0 {
			s, ok := b.sizeOf(f.Type)
			if !ok {
				b.missing = append(b.missing, fmt.Sprintf("%s::%s (size of %q)", typ, name, f.Type))
				return Member{}
			}
			size = s
		}
		return Member{Offset: f.Offset, Size: size}
	}
	b.missing = append(b.missing, typ+"::"+strings.Join(fields, "|"))
	return Member{}
}

func (b *layoutBuilder) static(typ, field string) uint64 {
	f, ok := b.vs.Fields[typ][field]
	if !ok || !f.Static || f.Address == 0 {
		b.missing = append(b.missing, typ+"::"+field)
		return 0
	}
	return f.Address
}

func (b *layoutBuilder) typeSize(typ string) uint64 {
	t, ok := b.vs.Types[typ]
	if !ok || t.Size == 0 {
		b.missing = append(b.missing, "sizeof("+typ+")")
		return 0
	}
	return t.Size
}

func (b *layoutBuilder) intConstant(names ...string) int64 {
	for _, n := range names {
		if v, ok := b.vs.IntConstants[n]; ok {
			return int64(v)
		}
	}
	b.missing = append(b.missing, strings.Join(names, "|"))
	return 0
}

// NewLayout reads from the tables what naming and a kernel walker need. A field missing
// is an error naming it (and every other one missing): nothing is filled in from
// knowledge of a version.
func NewLayout(vs *VMStructs) (*Layout, error) {
	b := &layoutBuilder{vs: vs}
	l := &Layout{}
	l.CodeCacheHeaps = b.static("CodeCache", "_heaps")
	l.CodeCacheLowBound = b.static("CodeCache", "_low_bound")
	l.CodeCacheHighBound = b.static("CodeCache", "_high_bound")
	l.versionAddr = b.static("Abstract_VM_Version", "_vm_major_version")
	l.InterpreterCode = b.static("AbstractInterpreter", "_code")
	l.StubQueueBuffer = b.member("StubQueue", 0, "_stub_buffer")
	l.StubQueueLimit = b.member("StubQueue", 0, "_buffer_limit")

	// GrowableArray<CodeHeap*> is not in the tables; every GrowableArray keeps its
	// length in GrowableArrayBase and its element pointer at the same place whatever the
	// element type, which GrowableArray<int> shows.
	l.GrowableArrayLen = b.member("GrowableArrayBase", 0, "_len")
	ga := "GrowableArray<CodeHeap*>"
	if !b.has(ga, "_data") {
		ga = "GrowableArray<int>"
	}
	l.GrowableArrayData = b.member(ga, 8, "_data")

	l.CodeHeapMemory = b.member("CodeHeap", 8, "_memory")
	l.CodeHeapSegmap = b.member("CodeHeap", 8, "_segmap")
	l.CodeHeapLog2SegmentSize = b.member("CodeHeap", 0, "_log2_segment_size")
	l.VirtualSpaceLow = b.member("VirtualSpace", 0, "_low")
	l.VirtualSpaceHigh = b.member("VirtualSpace", 0, "_high")
	l.HeapBlockSize = b.typeSize("HeapBlock")
	header := b.member("HeapBlock", 8, "_header")
	l.HeapBlockLength = b.member("HeapBlock::Header", 0, "_length")
	l.HeapBlockUsed = b.member("HeapBlock::Header", 0, "_used")
	l.HeapBlockLength.Offset += header.Offset
	l.HeapBlockUsed.Offset += header.Offset

	l.BlobName = b.member("CodeBlob", 0, "_name")
	l.BlobSize = b.member("CodeBlob", 0, "_size")
	l.BlobHeaderSize = b.member("CodeBlob", 0, "_header_size")
	l.BlobFrameSize = b.member("CodeBlob", 0, "_frame_size")
	l.BlobFrameComplete = b.member("CodeBlob", 0, "_frame_complete_offset")
	l.BlobDataOffset = b.member("CodeBlob", 0, "_data_offset")
	if b.has("CodeBlob", "_code_begin") {
		l.BlobCodeBegin = b.member("CodeBlob", 0, "_code_begin")
		l.CodeBeginIsPointer = true
	} else {
		l.BlobCodeBegin = b.member("CodeBlob", 0, "_code_offset")
	}
	if b.has("CodeBlob", "_kind") {
		l.BlobKind = b.member("CodeBlob", 0, "_kind")
		l.KindNMethod = b.intConstant("CodeBlobKind::Nmethod")
		l.HasBlobKind = true
	}

	// nmethod's fields were CompiledMethod's in JDK 17 (its superclass), as the tables
	// say by listing them under CompiledMethod.
	nm := func(want uint8, fields ...string) Member {
		for _, typ := range []string{"nmethod", "CompiledMethod"} {
			for _, f := range fields {
				if b.has(typ, f) {
					return b.member(typ, want, f)
				}
			}
		}
		return b.member("nmethod", want, fields...)
	}
	l.NMethodMethod = nm(0, "_method")
	l.NMethodCompileID = nm(0, "_compile_id")
	l.NMethodCompLevel = nm(0, "_comp_level")
	l.NMethodEntryBCI = nm(0, "_entry_bci")
	l.NMethodScopesPcsOffset = nm(0, "_scopes_pcs_offset")
	if b.has("nmethod", "_immutable_data") || b.has("CodeBlob", "_mutable_data") {
		l.NMethodImmutable = true
		l.NMethodImmutableData = nm(0, "_immutable_data")
		l.NMethodImmutableDataSize = nm(0, "_immutable_data_size")
		l.NMethodScopesDataOffset = nm(0, "_scopes_data_offset")
		l.BlobMutableData = b.member("CodeBlob", 0, "_mutable_data")
		l.BlobMutableDataSize = b.member("CodeBlob", 0, "_mutable_data_size")
		l.BlobRelocationSize = b.member("CodeBlob", 0, "_relocation_size")
	} else {
		l.NMethodScopesDataBegin = nm(0, "_scopes_data_begin")
		l.NMethodDependenciesOffset = nm(0, "_dependencies_offset")
		l.NMethodMetadataOffset = nm(0, "_metadata_offset")
		if !l.CodeBeginIsPointer {
			// A code offset with JDK 17's debug info fields: neither JDK 17's layout nor
			// 25's, and where its metadata lies is not known.
			b.missing = append(b.missing, "CodeBlob::_mutable_data (the metadata's place beside _code_offset)")
		}
	}
	l.PcDescSize = b.typeSize("PcDesc")
	l.PcDescPcOffset = b.member("PcDesc", 0, "_pc_offset")
	l.PcDescScope = b.member("PcDesc", 0, "_scope_decode_offset")

	l.MethodConstMethod = b.member("Method", 0, "_constMethod")
	l.MethodSize = b.typeSize("Method")
	l.ConstMethodSize = b.typeSize("ConstMethod")
	l.ConstMethodConstants = b.member("ConstMethod", 0, "_constants")
	// The flags' field and the line number table's bit in it are read as one pair:
	// JDK 17's u2 ConstMethod::_flags with ConstMethod::_has_linenumber_table, or
	// JDK 21's ConstMethodFlags (ConstMethod::_flags._flags) with its own constant.
	hasLines := "ConstMethod::_has_linenumber_table"
	if b.has("ConstMethod", "_flags._flags") {
		l.ConstMethodFlags = b.member("ConstMethod", 0, "_flags._flags")
		hasLines = "ConstMethodFlags::_misc_has_linenumber_table"
	} else {
		l.ConstMethodFlags = b.member("ConstMethod", 0, "_flags")
	}
	l.HasLineNumberTable = b.intConstant(hasLines)
	l.ConstMethodCode = b.member("ConstMethod", 0, "_code_size")
	l.ConstMethodNameIndex = b.member("ConstMethod", 0, "_name_index")
	l.ConstMethodSignatureIndex = b.member("ConstMethod", 0, "_signature_index")
	l.ConstMethodIDNum = b.member("ConstMethod", 0, "_method_idnum")

	l.ConstantPoolSize = b.typeSize("ConstantPool")
	l.ConstantPoolHolder = b.member("ConstantPool", 0, "_pool_holder")
	l.ConstantPoolLength = b.member("ConstantPool", 0, "_length")
	if b.has("ConstantPool", "_source_file_name_index") {
		l.ConstantPoolSourceFile = b.member("ConstantPool", 0, "_source_file_name_index")
	} else {
		// Older builds kept it in the class; the index still refers to its pool.
		l.ConstantPoolSourceFile = b.member("InstanceKlass", 0, "_source_file_name_index")
		l.SourceFileInKlass = true
	}
	l.KlassName = b.member("Klass", 0, "_name")
	l.InstanceKlassMethods = b.member("InstanceKlass", 0, "_methods")
	l.ArrayMethodsData = b.member("Array<Method*>", 8, "_data")
	l.ArrayMethodsLength = b.member("Array<int>", 0, "_length")
	l.SymbolLength = b.member("Symbol", 0, "_length")
	l.SymbolBody = b.member("Symbol", 1, "_body", "_body[0]")
	l.InvocationEntryBCI = b.intConstant("InvocationEntryBci")

	fr := &l.Frame
	fr.SenderSP = int32(b.intConstant("frame::interpreter_frame_sender_sp_offset"))
	fr.LastSP = int32(b.intConstant("frame::interpreter_frame_last_sp_offset"))
	ic := vs.IntConstants
	m, ok1 := ic["frame::interpreter_frame_method_offset"]
	loc, ok2 := ic["frame::interpreter_frame_locals_offset"]
	bcp, ok3 := ic["frame::interpreter_frame_bcp_offset"]
	switch {
	case ok1 && ok2 && ok3:
		fr.Method, fr.Locals, fr.BCP = m, loc, bcp
	case runtime.GOARCH != "amd64":
		b.missing = append(b.missing, "frame::interpreter_frame_method_offset", "frame::interpreter_frame_locals_offset",
			"frame::interpreter_frame_bcp_offset")
	default:
		fr.Method, fr.Locals, fr.BCP = fr.LastSP-1, fr.LastSP-5, fr.LastSP-6
		fr.Derived = true
	}

	if len(b.missing) > 0 {
		sort.Strings(b.missing)
		return nil, fmt.Errorf("%s: %w", strings.Join(b.missing, ", "), ErrMissing)
	}
	// The tables are the process's: an offset past any of HotSpot's structures (the
	// largest, JavaThread, is a few KiB) is not one.
	for _, m := range []Member{l.StubQueueBuffer, l.StubQueueLimit, l.GrowableArrayLen, l.GrowableArrayData,
		l.CodeHeapMemory, l.CodeHeapSegmap, l.CodeHeapLog2SegmentSize, l.VirtualSpaceLow, l.VirtualSpaceHigh,
		l.HeapBlockLength, l.HeapBlockUsed, l.BlobName, l.BlobSize, l.BlobHeaderSize, l.BlobFrameSize,
		l.BlobFrameComplete, l.BlobDataOffset, l.BlobCodeBegin, l.BlobKind, l.NMethodMethod, l.NMethodCompileID,
		l.NMethodCompLevel, l.NMethodEntryBCI, l.NMethodScopesPcsOffset, l.NMethodScopesDataBegin,
		l.NMethodDependenciesOffset, l.NMethodMetadataOffset, l.NMethodImmutableData, l.NMethodImmutableDataSize,
		l.NMethodScopesDataOffset, l.BlobMutableData, l.BlobMutableDataSize, l.BlobRelocationSize, l.PcDescPcOffset,
		l.PcDescScope, l.MethodConstMethod, l.ConstMethodConstants, l.ConstMethodFlags, l.ConstMethodCode,
		l.ConstMethodNameIndex, l.ConstMethodSignatureIndex, l.ConstMethodIDNum, l.ConstantPoolHolder,
		l.ConstantPoolLength, l.ConstantPoolSourceFile, l.KlassName, l.InstanceKlassMethods, l.ArrayMethodsLength,
		l.ArrayMethodsData, l.SymbolLength, l.SymbolBody} {
		if m.Offset > maxStructOffset {
			return nil, fmt.Errorf("implausible layout: a field at offset %d", m.Offset)
		}
	}
	for _, size := range []uint64{l.MethodSize, l.ConstMethodSize, l.ConstantPoolSize} {
		if size > maxStructOffset {
			return nil, fmt.Errorf("implausible layout: a type of %d bytes", size)
		}
	}
	if l.PcDescPcOffset.Offset+uint64(l.PcDescPcOffset.Size) > l.PcDescSize ||
		l.PcDescScope.Offset+uint64(l.PcDescScope.Size) > l.PcDescSize {
		return nil, fmt.Errorf("implausible layout: PcDesc's fields past its %d bytes", l.PcDescSize)
	}
	if l.CodeHeapLog2SegmentSize.Size != 4 || l.PcDescSize < 8 || l.HeapBlockSize == 0 || l.HeapBlockSize > 64 {
		return nil, fmt.Errorf("implausible layout: log2 segment size of %d bytes, PcDesc of %d, HeapBlock of %d",
			l.CodeHeapLog2SegmentSize.Size, l.PcDescSize, l.HeapBlockSize)
	}
	return l, nil
}
