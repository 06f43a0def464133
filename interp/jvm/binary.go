package jvm

import (
	"debug/elf"
	"errors"
	"fmt"
	"strings"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// ErrNotHotSpot: the file is not a HotSpot libjvm.so.
var ErrNotHotSpot = errors.New("not HotSpot")

// Symbols are the ELF virtual addresses of the serviceability globals a libjvm.so
// exports for out-of-process tools (the Serviceability Agent): the tables describing its
// own types, fields and constants, and the layout of their entries.
type Symbols struct {
	Structs, StructTypeName, StructFieldName, StructTypeString, StructIsStatic uint64
	StructOffset, StructAddress, StructStride                                  uint64
	Types, TypeTypeName, TypeSuperclassName, TypeIsOop, TypeIsInteger          uint64
	TypeIsUnsigned, TypeSize, TypeStride                                       uint64
	IntConstants, IntName, IntValue, IntStride                                 uint64
	LongConstants, LongName, LongValue, LongStride                             uint64
}

// symbolNames maps each field of Symbols to the global it is the address of.
func (s *Symbols) symbolNames() map[string]*uint64 {
	return map[string]*uint64{
		"gHotSpotVMStructs":                       &s.Structs,
		"gHotSpotVMStructEntryTypeNameOffset":     &s.StructTypeName,
		"gHotSpotVMStructEntryFieldNameOffset":    &s.StructFieldName,
		"gHotSpotVMStructEntryTypeStringOffset":   &s.StructTypeString,
		"gHotSpotVMStructEntryIsStaticOffset":     &s.StructIsStatic,
		"gHotSpotVMStructEntryOffsetOffset":       &s.StructOffset,
		"gHotSpotVMStructEntryAddressOffset":      &s.StructAddress,
		"gHotSpotVMStructEntryArrayStride":        &s.StructStride,
		"gHotSpotVMTypes":                         &s.Types,
		"gHotSpotVMTypeEntryTypeNameOffset":       &s.TypeTypeName,
		"gHotSpotVMTypeEntrySuperclassNameOffset": &s.TypeSuperclassName,
		"gHotSpotVMTypeEntryIsOopTypeOffset":      &s.TypeIsOop,
		"gHotSpotVMTypeEntryIsIntegerTypeOffset":  &s.TypeIsInteger,
		"gHotSpotVMTypeEntryIsUnsignedOffset":     &s.TypeIsUnsigned,
		"gHotSpotVMTypeEntrySizeOffset":           &s.TypeSize,
		"gHotSpotVMTypeEntryArrayStride":          &s.TypeStride,
		"gHotSpotVMIntConstants":                  &s.IntConstants,
		"gHotSpotVMIntConstantEntryNameOffset":    &s.IntName,
		"gHotSpotVMIntConstantEntryValueOffset":   &s.IntValue,
		"gHotSpotVMIntConstantEntryArrayStride":   &s.IntStride,
		"gHotSpotVMLongConstants":                 &s.LongConstants,
		"gHotSpotVMLongConstantEntryNameOffset":   &s.LongName,
		"gHotSpotVMLongConstantEntryValueOffset":  &s.LongValue,
		"gHotSpotVMLongConstantEntryArrayStride":  &s.LongStride,
	}
}

// LibJVM is what a libjvm.so file tells of itself, before any process is read.
type LibJVM struct {
	Symbols Symbols
	loads   objfile.Loads
}

// Bias returns the load bias of the file mapped at start from file offset offset.
func (l *LibJVM) Bias(start, offset uint64) (uint64, bool) { return l.loads.Bias(start, offset) }

// IsLibJVM tells by its path whether a mapped file may be HotSpot: only libjvm.so is
// opened, so that a process costs no look into its other files.
func IsLibJVM(path string) bool {
	i := strings.LastIndexByte(path, '/')
	return path[i+1:] == "libjvm.so"
}

// Inspect reads the serviceability symbols of a libjvm.so. A file without them is not
// HotSpot, or a build sonde cannot read (ErrNotHotSpot, with the names missing).
func Inspect(f *elf.File) (l *LibJVM, err error) {
	defer func() {
		if p := recover(); p != nil {
			l, err = nil, fmt.Errorf("inspect libjvm: corrupt file: %v", p)
		}
	}()
	// Read in place: libjvm.so exports tens of thousands of symbols, and listing them
	// with a string each costs megabytes to find a dozen.
	table, err := objfile.OpenSymbols(f, elf.SHT_DYNSYM)
	if err != nil {
		return nil, fmt.Errorf("read dynamic symbols: %w", err)
	}
	if table == nil {
		return nil, ErrNotHotSpot
	}
	l = &LibJVM{}
	want := l.Symbols.symbolNames()
	found := 0
	table.Each(func(i int, name []byte) bool {
		p, ok := want[string(name)]
		if s := table.At(i); ok && s.Section != elf.SHN_UNDEF && *p == 0 {
			*p = s.Value
			found++
		}
		return true
	})
	if found == 0 {
		return nil, ErrNotHotSpot
	}
	if found < len(want) {
		var missing []string
		for name, p := range want {
			if *p == 0 {
				missing = append(missing, name)
			}
		}
		return nil, fmt.Errorf("libjvm without %s: %w", strings.Join(missing, ", "), ErrNotHotSpot)
	}
	l.loads = objfile.LoadsOf(f)
	if len(l.loads) == 0 {
		return nil, fmt.Errorf("libjvm without loadable segments: %w", ErrNotHotSpot)
	}
	return l, nil
}

// InspectFile opens a mapped file through objfile and inspects it.
func InspectFile(f *objfile.File) (*LibJVM, error) {
	h, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	var l *LibJVM
	err = h.InspectELF(ErrNotHotSpot, func(e *elf.File) (err error) {
		l, err = Inspect(e)
		return err
	})
	return l, err
}
