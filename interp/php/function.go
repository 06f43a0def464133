package php

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/sonde-profiler/sonde/internal/procmem"
)

// Memory reads a process's memory; ProcessMemory reads a live one's.
type (
	Memory        = procmem.Reader
	ProcessMemory = procmem.Process
)

// Function is what names the frames of one zend_function.
type Function struct {
	Name      string // "Dock::unload", "harbor", "{main}", "{closure}"
	File      string // the script, for user code; "" for an internal function
	FirstLine int
	LastLine  int
	Internal  bool
	script    bool // a script's body, known by its file name: its lines are not known
	// print tells this function from another at the same address: the addresses of its
	// name, class and file, and its first line, which another function's would not share.
	print [4]uint64
}

// Line returns the line a frame of the function runs: the one the kernel read from the
// frame's opline where it lies in the function, else the function's first. The JIT keeps
// the current opline in a register and stores it in the frame only where it must (a call,
// an exception), so the frame's may be stale or never set.
func (f *Function) Line(line uint32) int {
	saturated := line >= 1<<lineBits-1 // past what the frame's bits hold: not known
	switch {
	case f.Internal:
		return 0
	case f.script && saturated:
		return 0
	case f.script:
		return int(line)
	case saturated:
		return f.FirstLine
	}
	if l := int(line); l >= f.FirstLine && l <= f.LastLine {
		return l
	}
	return f.FirstLine
}

// The function types of zend_function.type.
const (
	internalFunction = 1
	userFunction     = 2
	evalCode         = 4
)

// callTop is ZEND_CALL_TOP, the call info bit of the frame execute_ex was entered for.
const callTop = 1 << 17

// stringType is IS_STRING, a zend_string's type in the low bits of its type_info (GC_TYPE_MASK),
// above which are its flags (interned, persistent).
const (
	stringType = 6
	typeMask   = 0x0f
)

// Bounds on what a function may make the reader read.
const (
	maxStringBytes = 4096 // a name or file name longer than this is cut
	funcHeadSize   = 24   // zend_function up to scope
)

var errNotFunction = errors.New("not a php function")

// Image is an engine as mapped in one process.
type Image struct {
	Version Version
	Layout  Layout
	bias    uint64 // where the tracker placed it, and for which exec
	execID  uint64
	jit     [2]uint64 // the JIT buffer the kernel was told of
}

// ReadCode reads what a frame's code names: the zend_function at its address, or for a
// script's body (Script) its file name.
func (img *Image) ReadCode(m Memory, code uint64) (*Function, error) {
	if code&Script == 0 {
		return img.ReadFunction(m, code)
	}
	file, err := img.readString(m, code&^Script)
	if err != nil {
		return nil, fmt.Errorf("script at %#x: file name: %w", code&^Script, err)
	}
	if file == "" {
		return nil, fmt.Errorf("script at %#x: empty file name: %w", code&^Script, errNotFunction)
	}
	return &Function{Name: "{main}", File: file, script: true, print: [4]uint64{code, uint64(len(file))}}, nil
}

// ReadFunction reads the zend_function at addr.
func (img *Image) ReadFunction(m Memory, addr uint64) (*Function, error) {
	l := img.Layout
	var head [funcHeadSize]byte
	if err := m.ReadAt(head[:], addr); err != nil {
		return nil, err
	}
	typ := head[l.FuncType]
	if typ != internalFunction && typ != userFunction && typ != evalCode {
		return nil, fmt.Errorf("function at %#x: type %d: %w", addr, typ, errNotFunction)
	}
	nameAt := binary.LittleEndian.Uint64(head[l.FuncName:])
	scope := binary.LittleEndian.Uint64(head[l.FuncScope:])
	fn := &Function{Internal: typ == internalFunction}
	fn.print[0], fn.print[1] = nameAt, scope
	name, err := img.readString(m, nameAt)
	if err != nil {
		return nil, fmt.Errorf("function at %#x: name: %w", addr, err)
	}
	switch {
	case typ == evalCode:
		name = "{eval}"
	case name == "":
		name = "{main}" // a script's body, which has no name
	}
	if scope != 0 {
		classAt, err := procmem.ReadU64(m, scope+uint64(l.ClassName))
		if err != nil {
			return nil, fmt.Errorf("function at %#x: class: %w", addr, err)
		}
		class, err := img.readString(m, classAt)
		if err != nil {
			return nil, fmt.Errorf("function at %#x: class name: %w", addr, err)
		}
		if class != "" {
			name = class + "::" + name
		}
	}
	fn.Name = name
	if fn.Internal {
		return fn, nil
	}
	var tail [16]byte
	if err := m.ReadAt(tail[:], addr+uint64(l.OpArrayFilename)); err != nil {
		return nil, fmt.Errorf("function at %#x: file: %w", addr, err)
	}
	fileAt := binary.LittleEndian.Uint64(tail[:])
	fn.FirstLine = int(binary.LittleEndian.Uint32(tail[l.OpArrayLineStart-l.OpArrayFilename:]))
	fn.LastLine = int(binary.LittleEndian.Uint32(tail[l.OpArrayLineStart-l.OpArrayFilename+4:]))
	fn.print[2], fn.print[3] = fileAt, uint64(fn.FirstLine)
	if fn.File, err = img.readString(m, fileAt); err != nil {
		return nil, fmt.Errorf("function at %#x: file name: %w", addr, err)
	}
	return fn, nil
}

// readFingerprint reads what tells a function from another at the same address; a script's
// file name, its length.
func (img *Image) readFingerprint(m Memory, addr uint64) ([4]uint64, error) {
	if addr&Script != 0 {
		file, err := img.readString(m, addr&^Script)
		return [4]uint64{addr, uint64(len(file))}, err
	}
	l := img.Layout
	var print [4]uint64
	var head [funcHeadSize]byte
	if err := m.ReadAt(head[:], addr); err != nil {
		return print, err
	}
	print[0] = binary.LittleEndian.Uint64(head[l.FuncName:])
	print[1] = binary.LittleEndian.Uint64(head[l.FuncScope:])
	if head[l.FuncType] == internalFunction {
		return print, nil
	}
	var tail [12]byte
	if err := m.ReadAt(tail[:], addr+uint64(l.OpArrayFilename)); err != nil {
		return print, err
	}
	print[2] = binary.LittleEndian.Uint64(tail[:])
	print[3] = uint64(binary.LittleEndian.Uint32(tail[l.OpArrayLineStart-l.OpArrayFilename:]))
	return print, nil
}

// readString reads a zend_string; address 0 is the empty string.
func (img *Image) readString(m Memory, addr uint64) (string, error) {
	if addr == 0 {
		return "", nil
	}
	l := img.Layout
	head := make([]byte, l.StrVal)
	if err := m.ReadAt(head, addr); err != nil {
		return "", err
	}
	if head[l.StrTypeInfo]&typeMask != stringType {
		return "", fmt.Errorf("string at %#x: type %d: %w", addr, head[l.StrTypeInfo]&typeMask, errNotFunction)
	}
	n := binary.LittleEndian.Uint64(head[l.StrLen:])
	if n > maxStringBytes {
		n = maxStringBytes
	}
	b := make([]byte, n)
	if err := m.ReadAt(b, addr+uint64(l.StrVal)); err != nil {
		return "", err
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), nil
}
