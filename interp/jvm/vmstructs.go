package jvm

import (
	"encoding/binary"
	"errors"
	"fmt"
)

var errStringTooLong = errors.New("string longer than expected")

// Field is one entry of gHotSpotVMStructs: a field of one of HotSpot's C++ types.
type Field struct {
	Type   string // the field's C++ type, as the table spells it ("address", "CodeHeap*")
	Static bool
	// Offset is a non-static field's offset in its type; Address a static field's
	// address in the process (relocated when read).
	Offset  uint64
	Address uint64
}

// Type is one entry of gHotSpotVMTypes.
type Type struct {
	Super                  string
	Size                   uint64
	Oop, Integer, Unsigned bool
}

// VMStructs is HotSpot's self-description, as one process holds it: its types with their
// sizes, their fields with offsets (or, for statics, addresses), and named constants.
type VMStructs struct {
	Fields        map[string]map[string]Field // type name, field name
	Types         map[string]Type
	IntConstants  map[string]int32
	LongConstants map[string]uint64
}

// Bounds on the tables: HotSpot's hold a few thousand entries of a few dozen bytes each.
const (
	maxTableEntries = 1 << 15
	maxEntryStride  = 256
	tableChunk      = 64 // entries read at once
)

// ReadVMStructs reads the serviceability tables from a process that maps libjvm at
// bias. The tables' entry layouts come from the process too (the *Offset and *Stride
// globals): nothing of them is assumed but that pointers are 8 bytes.
func ReadVMStructs(m Memory, syms *Symbols, bias uint64) (*VMStructs, error) {
	vs := &VMStructs{
		Fields:        map[string]map[string]Field{},
		Types:         map[string]Type{},
		IntConstants:  map[string]int32{},
		LongConstants: map[string]uint64{},
	}
	r := tableReader{m: m, bias: bias, strs: map[uint64]string{}}
	// gHotSpotVMStructs and the other table globals are pointers to the tables; the
	// offsets and strides are 64-bit integers.
	structs, err := r.table("structs", syms.Structs, syms.StructStride, map[string]uint64{
		"typeName": syms.StructTypeName, "fieldName": syms.StructFieldName, "typeString": syms.StructTypeString,
		"isStatic": syms.StructIsStatic, "offset": syms.StructOffset, "address": syms.StructAddress,
	}, "typeName")
	if err != nil {
		return nil, err
	}
	for i, e := range structs {
		typeName, err := r.str(e.u64("typeName"))
		if err != nil {
			return nil, fmt.Errorf("read vmStructs entry %d type name: %w", i, err)
		}
		fieldName, err := r.str(e.u64("fieldName"))
		if err != nil {
			return nil, fmt.Errorf("read vmStructs entry %d field name: %w", i, err)
		}
		var typeString string
		if p := e.u64("typeString"); p != 0 {
			if typeString, err = r.str(p); err != nil {
				return nil, fmt.Errorf("read vmStructs entry %d type string: %w", i, err)
			}
		}
		f := Field{Type: typeString, Static: e.u32("isStatic") != 0}
		if f.Static {
			f.Address = e.u64("address")
		} else {
			f.Offset = e.u64("offset")
		}
		if vs.Fields[typeName] == nil {
			vs.Fields[typeName] = map[string]Field{}
		}
		vs.Fields[typeName][fieldName] = f
	}
	types, err := r.table("types", syms.Types, syms.TypeStride, map[string]uint64{
		"typeName": syms.TypeTypeName, "superclassName": syms.TypeSuperclassName, "isOopType": syms.TypeIsOop,
		"isIntegerType": syms.TypeIsInteger, "isUnsigned": syms.TypeIsUnsigned, "size": syms.TypeSize,
	}, "typeName")
	if err != nil {
		return nil, err
	}
	for i, e := range types {
		name, err := r.str(e.u64("typeName"))
		if err != nil {
			return nil, fmt.Errorf("read vmTypes entry %d name: %w", i, err)
		}
		t := Type{Size: e.u64("size"), Oop: e.u32("isOopType") != 0, Integer: e.u32("isIntegerType") != 0,
			Unsigned: e.u32("isUnsigned") != 0}
		if p := e.u64("superclassName"); p != 0 {
			if t.Super, err = r.str(p); err != nil {
				return nil, fmt.Errorf("read vmTypes entry %d superclass: %w", i, err)
			}
		}
		vs.Types[name] = t
	}
	ints, err := r.table("int constants", syms.IntConstants, syms.IntStride, map[string]uint64{
		"name": syms.IntName, "value": syms.IntValue,
	}, "name")
	if err != nil {
		return nil, err
	}
	for i, e := range ints {
		name, err := r.str(e.u64("name"))
		if err != nil {
			return nil, fmt.Errorf("read int constant %d name: %w", i, err)
		}
		vs.IntConstants[name] = int32(e.u32("value"))
	}
	longs, err := r.table("long constants", syms.LongConstants, syms.LongStride, map[string]uint64{
		"name": syms.LongName, "value": syms.LongValue,
	}, "name")
	if err != nil {
		return nil, err
	}
	for i, e := range longs {
		name, err := r.str(e.u64("name"))
		if err != nil {
			return nil, fmt.Errorf("read long constant %d name: %w", i, err)
		}
		vs.LongConstants[name] = e.u64("value")
	}
	return vs, nil
}

type tableReader struct {
	m    Memory
	bias uint64
	strs map[uint64]string // names repeat (a type's name in each of its fields' entries)
}

func (r *tableReader) str(p uint64) (string, error) {
	if p == 0 {
		return "", errors.New("null name")
	}
	if s, ok := r.strs[p]; ok {
		return s, nil
	}
	s, err := readCString(r.m, p, maxCString)
	if err != nil {
		return "", err
	}
	r.strs[p] = s
	return s, nil
}

// entry is one table entry's bytes and where each of its fields lies in them.
type entry struct {
	b    []byte
	offs map[string]uint64
}

func (e entry) u64(name string) uint64 { return binary.LittleEndian.Uint64(e.b[e.offs[name]:]) }
func (e entry) u32(name string) uint32 { return binary.LittleEndian.Uint32(e.b[e.offs[name]:]) }

// table reads the entries of one table up to its terminating entry, whose key field (a
// name pointer) is null.
func (r *tableReader) table(what string, tableSym, strideSym uint64, fieldSyms map[string]uint64, key string) ([]entry, error) {
	base, err := readU64(r.m, tableSym+r.bias)
	if err != nil {
		return nil, fmt.Errorf("read %s table address: %w", what, err)
	}
	stride, err := readU64(r.m, strideSym+r.bias)
	if err != nil {
		return nil, fmt.Errorf("read %s stride: %w", what, err)
	}
	if base == 0 {
		// A relocated pointer: zero only before the dynamic loader relocated libjvm.
		return nil, fmt.Errorf("%s table: null: %w", what, ErrNotReady)
	}
	if stride < 8 || stride > maxEntryStride {
		return nil, fmt.Errorf("%s table at %#x with stride %d: implausible", what, base, stride)
	}
	offs := make(map[string]uint64, len(fieldSyms))
	for name, sym := range fieldSyms {
		off, err := readU64(r.m, sym+r.bias)
		if err != nil {
			return nil, fmt.Errorf("read %s entry offset of %s: %w", what, name, err)
		}
		// Pointers and 64-bit values take 8 bytes; the 32-bit flags fit as well within.
		// (Compared without adding to off, which the process chose and may overflow.)
		if off > stride || stride-off < 8 {
			return nil, fmt.Errorf("%s entry field %s at %d past the stride %d", what, name, off, stride)
		}
		offs[name] = off
	}
	var out []entry
	buf := make([]byte, stride*tableChunk)
	for start := 0; start < maxTableEntries; start += tableChunk {
		addr := base + uint64(start)*stride
		n := tableChunk
		if err := r.m.ReadAt(buf, addr); err != nil {
			// The table may end just before unmapped memory: read entry by entry.
			n = 0
			for ; n < tableChunk; n++ {
				if r.m.ReadAt(buf[uint64(n)*stride:uint64(n+1)*stride], addr+uint64(n)*stride) != nil {
					break
				}
			}
			if n == 0 {
				return nil, fmt.Errorf("read %s entry %d: %w", what, start, err)
			}
		}
		for i := 0; i < n; i++ {
			e := entry{b: append([]byte(nil), buf[uint64(i)*stride:uint64(i+1)*stride]...), offs: offs}
			if e.u64(key) == 0 {
				return out, nil
			}
			out = append(out, e)
		}
		if n < tableChunk {
			return nil, fmt.Errorf("%s table at %#x: unterminated before unreadable memory", what, base)
		}
	}
	return nil, fmt.Errorf("%s table at %#x: more than %d entries", what, base, maxTableEntries)
}
