package jvm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// MethodInfo is a Java method as its Method and ConstMethod describe it.
type MethodInfo struct {
	Method, ConstMethod uint64
	Class               string // java.lang.String
	Name                string
	Signature           string // the descriptor: (Ljava/lang/String;I)V
	File                string // the source file, "" when the class says none
	IDNum               uint16
	CodeSize            uint16
	Lines               []LinePair // nil when the method has no line number table

	// identity is the ConstMethod fields a later read must find again for a cached
	// MethodInfo to still be this method.
	identity record
}

// Function is the method's name qualified by its class.
func (mi *MethodInfo) Function() string { return mi.Class + "." + mi.Name }

// Line returns the source line of bci, or -1.
func (mi *MethodInfo) Line(bci int32) int32 {
	if bci < 0 || (mi.CodeSize > 0 && bci >= int32(mi.CodeSize)) {
		// SynchronizationEntryBCI and the like: HotSpot takes them as bci 0.
		bci = 0
	}
	return LineAt(mi.Lines, bci)
}

var errNotAMethod = errors.New("not a method")

// Bounds on what a method points to.
const (
	maxSymbolLength  = 1 << 16 // Symbol::_length is a u2
	maxMethods       = 1 << 16 // a class has at most 65535 methods
	maxLineTableSize = 1 << 20 // at most 11 bytes for each of 65535 bytecodes
)

func (p *Process) constMethodMembers() []Member {
	l := p.Layout
	return []Member{l.ConstMethodConstants, l.ConstMethodFlags, l.ConstMethodCode, l.ConstMethodNameIndex,
		l.ConstMethodSignatureIndex, l.ConstMethodIDNum}
}

// constMethodOf reads a Method's ConstMethod: its address and the fields that identify it.
func (p *Process) constMethodOf(method uint64) (uint64, record, error) {
	if method == 0 || method%8 != 0 {
		return 0, nil, fmt.Errorf("method %#x: %w", method, errNotAMethod)
	}
	cm, err := readU64(p.m, method+p.Layout.MethodConstMethod.Offset)
	if err != nil {
		return 0, nil, fmt.Errorf("read method %#x: %w", method, err)
	}
	if cm == 0 || cm%8 != 0 {
		return 0, nil, fmt.Errorf("method %#x with ConstMethod %#x: %w", method, cm, errNotAMethod)
	}
	r, err := p.record(cm, p.constMethodMembers()...)
	if err != nil {
		return 0, nil, fmt.Errorf("read ConstMethod %#x: %w", cm, err)
	}
	return cm, r, nil
}

// ReadMethod reads a method's class, name, signature, source file and line table. The
// method must be one of its class's methods (InstanceKlass::_methods): a pointer to
// anything else is refused rather than named.
func (p *Process) ReadMethod(method uint64) (*MethodInfo, error) {
	l := p.Layout
	cm, r, err := p.constMethodOf(method)
	if err != nil {
		return nil, err
	}
	mi := &MethodInfo{Method: method, ConstMethod: cm, identity: r,
		IDNum: uint16(r.u(l.ConstMethodIDNum)), CodeSize: uint16(r.u(l.ConstMethodCode))}
	cp := r.u(l.ConstMethodConstants)
	cpr, err := p.record(cp, l.ConstantPoolHolder, l.ConstantPoolLength)
	if err != nil {
		return nil, fmt.Errorf("read constant pool %#x: %w", cp, err)
	}
	holder := cpr.u(l.ConstantPoolHolder)
	if err := p.checkMethodOf(holder, method); err != nil {
		return nil, err
	}
	poolLen := uint64(cpr.u(l.ConstantPoolLength))
	if mi.Name, err = p.poolSymbol(cp, poolLen, r.u(l.ConstMethodNameIndex)); err != nil {
		return nil, fmt.Errorf("method %#x name: %w", method, err)
	}
	if mi.Signature, err = p.poolSymbol(cp, poolLen, r.u(l.ConstMethodSignatureIndex)); err != nil {
		return nil, fmt.Errorf("method %#x signature: %w", method, err)
	}
	kn, err := readU64(p.m, holder+l.KlassName.Offset)
	if err != nil {
		return nil, fmt.Errorf("read class %#x name: %w", holder, err)
	}
	if mi.Class, err = p.symbol(kn); err != nil {
		return nil, fmt.Errorf("class %#x name: %w", holder, err)
	}
	mi.Class = strings.ReplaceAll(mi.Class, "/", ".")
	if mi.File, err = p.sourceFile(cp, poolLen, holder); err != nil {
		return nil, fmt.Errorf("class %s source file: %w", mi.Class, err)
	}
	if int64(r.u(l.ConstMethodFlags))&l.HasLineNumberTable != 0 {
		// The table follows the bytecodes, which follow the ConstMethod.
		at := cm + l.ConstMethodSize + uint64(mi.CodeSize)
		if mi.Lines, err = p.lineTable(at); err != nil {
			return nil, fmt.Errorf("method %s.%s line table: %w", mi.Class, mi.Name, err)
		}
	}
	return mi, nil
}

// stillSame tells whether the method read earlier is still the one at its address: its
// ConstMethod is the same, with the same fields.
func (p *Process) stillSame(mi *MethodInfo) bool {
	cm, r, err := p.constMethodOf(mi.Method)
	return err == nil && cm == mi.ConstMethod && slices.Equal(r, mi.identity)
}

// checkMethodOf checks that method is among the methods of class holder.
func (p *Process) checkMethodOf(holder, method uint64) error {
	l := p.Layout
	if holder == 0 || holder%8 != 0 {
		return fmt.Errorf("method %#x of class %#x: %w", method, holder, errNotAMethod)
	}
	arr, err := readU64(p.m, holder+l.InstanceKlassMethods.Offset)
	if err != nil {
		return fmt.Errorf("read class %#x methods: %w", holder, err)
	}
	n, err := readU32(p.m, arr+l.ArrayMethodsLength.Offset)
	if err != nil {
		return fmt.Errorf("read class %#x methods: %w", holder, err)
	}
	if int32(n) <= 0 || n > maxMethods {
		return fmt.Errorf("class %#x with %d methods: %w", holder, int32(n), errNotAMethod)
	}
	ptrs, err := p.read(arr+l.ArrayMethodsData.Offset, uint64(n)*8)
	if err != nil {
		return fmt.Errorf("read class %#x methods: %w", holder, err)
	}
	for i := 0; i < len(ptrs); i += 8 {
		if binary.LittleEndian.Uint64(ptrs[i:]) == method {
			return nil
		}
	}
	return fmt.Errorf("method %#x not among its class's %d methods: %w", method, n, errNotAMethod)
}

// poolSymbol reads the Symbol a constant pool entry holds: the pool's entries follow its
// header, a word each.
func (p *Process) poolSymbol(cp, poolLen, index uint64) (string, error) {
	if index == 0 || index >= poolLen {
		return "", fmt.Errorf("constant pool index %d of %d", index, poolLen)
	}
	sym, err := readU64(p.m, cp+p.Layout.ConstantPoolSize+index*8)
	if err != nil {
		return "", fmt.Errorf("read constant pool entry %d: %w", index, err)
	}
	return p.symbol(sym)
}

func (p *Process) sourceFile(cp, poolLen, holder uint64) (string, error) {
	m := p.Layout.ConstantPoolSourceFile
	base := cp
	if p.Layout.SourceFileInKlass {
		base = holder
	}
	r, err := p.record(base, m)
	if err != nil {
		return "", err
	}
	idx := r.u(m)
	if idx == 0 {
		return "", nil // compiled without a SourceFile attribute
	}
	return p.poolSymbol(cp, poolLen, idx)
}

// symbol reads a Symbol: its length, then its bytes in modified UTF-8.
func (p *Process) symbol(addr uint64) (string, error) {
	l := p.Layout
	if addr == 0 {
		return "", errors.New("null symbol")
	}
	r, err := p.record(addr, l.SymbolLength)
	if err != nil {
		return "", fmt.Errorf("read symbol %#x: %w", addr, err)
	}
	n := r.u(l.SymbolLength)
	if n >= maxSymbolLength {
		return "", fmt.Errorf("symbol %#x of %d bytes", addr, n)
	}
	b, err := p.read(addr+l.SymbolBody.Offset, n)
	if err != nil {
		return "", fmt.Errorf("read symbol %#x: %w", addr, err)
	}
	return modifiedUTF8(b), nil
}

// modifiedUTF8 converts Java's modified UTF-8 (NUL as two bytes, characters beyond the
// BMP as two encoded surrogates) to UTF-8; what is not valid becomes U+FFFD.
func modifiedUTF8(b []byte) string {
	if utf8.Valid(b) && !strings.Contains(string(b), "\xc0\x80") {
		return string(b)
	}
	var sb strings.Builder
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c < 0x80:
			sb.WriteByte(c)
			i++
		case c&0xE0 == 0xC0 && i+1 < len(b) && b[i+1]&0xC0 == 0x80:
			sb.WriteRune(rune(c&0x1F)<<6 | rune(b[i+1]&0x3F))
			i += 2
		case c&0xF0 == 0xE0 && i+2 < len(b) && b[i+1]&0xC0 == 0x80 && b[i+2]&0xC0 == 0x80:
			r := rune(c&0x0F)<<12 | rune(b[i+1]&0x3F)<<6 | rune(b[i+2]&0x3F)
			i += 3
			if r >= 0xD800 && r < 0xDC00 && i+2 < len(b) && b[i] == 0xED && b[i+1]&0xF0 == 0xB0 && b[i+2]&0xC0 == 0x80 {
				lo := rune(0xD)<<12 | rune(b[i+1]&0x3F)<<6 | rune(b[i+2]&0x3F)
				r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
				i += 3
			}
			sb.WriteRune(r) // an unpaired surrogate becomes U+FFFD
		default:
			sb.WriteRune(utf8.RuneError)
			i++
		}
	}
	return sb.String()
}

// lineTable reads a compressed line number table, whose length only its terminator
// tells: page by page, until it is found.
func (p *Process) lineTable(addr uint64) ([]LinePair, error) {
	const page = 4096
	var buf []byte
	for uint64(len(buf)) < maxLineTableSize {
		n := page - (addr+uint64(len(buf)))%page
		more, err := p.read(addr+uint64(len(buf)), n)
		if err != nil {
			return nil, err
		}
		buf = append(buf, more...)
		pairs, _, err := DecodeLineTable(buf, p.x)
		if err == nil {
			return pairs, nil
		}
		if !errors.Is(err, errStreamEnd) {
			return nil, err
		}
	}
	return nil, errors.New("line number table without its end")
}

// BCIOf converts an interpreter frame's bytecode pointer to a bci: the bytecodes follow
// the ConstMethod.
func (p *Process) BCIOf(mi *MethodInfo, bcp uint64) (int32, error) {
	start := mi.ConstMethod + p.Layout.ConstMethodSize
	if bcp < start || bcp >= start+uint64(mi.CodeSize) {
		return 0, fmt.Errorf("bcp %#x outside the %d bytes of bytecode of %s at %#x", bcp, mi.CodeSize, mi.Function(), start)
	}
	return int32(bcp - start), nil
}
