package ruby

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/arch/x86/x86asm"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/procmem"
	"github.com/sonde-profiler/sonde/interp"
)

// Method marks the code of a frame the kernel named by its method entry
// (rb_callable_method_entry_t): a Ruby method's, whose class it holds with its sequence,
// or a C method's.
const Method = 1 << 63

// Method entries and definitions, the same in 3.1 to 3.4: rb_method_entry_t's flags,
// defined_class, def, called_id and owner in turn; rb_method_definition_t's type (its
// low 4 bits), its body (an iseq method's rb_iseq_t first), and original_id.
const (
	meSize         = 40
	meDef          = 16
	meCalledID     = 24
	meOwner        = 32
	defBody        = 8
	defOriginalID  = 32
	defTypeMask    = 0xf
	methodISeq     = 0 // VM_METHOD_TYPE_ISEQ
	methodCFunc    = 1 // VM_METHOD_TYPE_CFUNC
	imemoMent      = 6
	imemoSvar      = 2 // struct vm_svar, which holds the method entry it replaced
	svarCrefOrMe   = 8
	rbasicKlass    = 8    // RBasic.klass
	typeClass      = 0x02 // T_CLASS
	typeModule     = 0x03 // T_MODULE
	typeIClass     = 0x1c // T_ICLASS: a module as included, its klass the module
	maxClassNest   = 8    // singleton of singleton ... bounded
	idEntryUnit    = 512  // symbol.c: IDs per chunk of the global symbol table
	idEntrySize    = 2    // each ID's string, then its symbol
	idScopeShift   = 4    // RUBY_ID_SCOPE_SHIFT
	symIDsOffset   = 16   // rb_symbols_t: last_id, str_sym, ids
	maxIvarEntries = 64
	stEntries      = 48 // st_table (3.1): entries_start, entries_bound at 32, 40; entries at 48
	stEntrySize    = 24 // hash, key, record
)

var errNotMethod = errors.New("not a method entry")

// readMethod reads the method entry at addr: a Ruby method is named by its sequence, with
// its class ("Orchard#pluck", "Orchard.build" for a singleton method); a C method by its
// name, with its class ("Array#each"), where the file shows the VM's symbol table.
func (img *Image) readMethod(m Memory, addr uint64) (*Iseq, error) {
	me, err := readMethodEntry(m, addr)
	if err != nil {
		return nil, err
	}
	def := binary.LittleEndian.Uint64(me[meDef:])
	var d [defOriginalID + 8]byte
	if err := m.ReadAt(d[:], def); err != nil {
		return nil, fmt.Errorf("method entry at %#x: definition: %w", addr, err)
	}
	class, singleton := img.classPath(m, binary.LittleEndian.Uint64(me[meOwner:]))
	var q *Iseq
	switch typ := binary.LittleEndian.Uint32(d[:]) & defTypeMask; typ {
	case methodISeq:
		if q, err = img.ReadIseq(m, binary.LittleEndian.Uint64(d[defBody:])); err != nil {
			return nil, fmt.Errorf("method entry at %#x: %w", addr, err)
		}
	case methodCFunc:
		name, err := img.idName(m, binary.LittleEndian.Uint64(d[defOriginalID:]))
		if err != nil {
			name, err = img.idName(m, binary.LittleEndian.Uint64(me[meCalledID:]))
		}
		if err != nil {
			return nil, fmt.Errorf("c method at %#x: name: %w", addr, err)
		}
		q = &Iseq{Label: name}
	default:
		return nil, fmt.Errorf("method entry at %#x: type %d: %w", addr, typ, errNotMethod)
	}
	q.Label = qualified(class, q.Label, singleton)
	q.print = [4]uint64{def, binary.LittleEndian.Uint64(me[meOwner:]), binary.LittleEndian.Uint64(me[meCalledID:]), Method}
	return q, nil
}

// readMethodEntry reads the method entry the kernel found in a frame's ep[-2]: the entry
// itself, or the svar holding it.
func readMethodEntry(m Memory, addr uint64) (me [meSize]byte, err error) {
	for range 2 {
		if err := m.ReadAt(me[:], addr); err != nil {
			return me, err
		}
		flags := binary.LittleEndian.Uint64(me[:])
		if flags&typeMask == typeImemo {
			switch flags >> imemoShift & imemoMask {
			case imemoMent:
				return me, nil
			case imemoSvar:
				addr = binary.LittleEndian.Uint64(me[svarCrefOrMe:])
				continue
			}
		}
		return me, fmt.Errorf("method entry at %#x: flags %#x: %w", addr, flags, errNotMethod)
	}
	return me, fmt.Errorf("method entry at %#x: an svar in an svar: %w", addr, errNotMethod)
}

// readMethodFingerprint reads what tells a method entry from another at its address.
func (img *Image) readMethodFingerprint(m Memory, addr uint64) ([4]uint64, error) {
	me, err := readMethodEntry(m, addr)
	if err != nil {
		return [4]uint64{}, err
	}
	return [4]uint64{binary.LittleEndian.Uint64(me[meDef:]), binary.LittleEndian.Uint64(me[meOwner:]),
		binary.LittleEndian.Uint64(me[meCalledID:]), Method}, nil
}

// qualified joins a class's path and a method's name as Ruby's backtraces do since 3.4,
// unless the label has it already (3.4's own labels). A method defined at the top level
// of a script is Object's, private: it keeps its bare name, as a script's functions do in
// other languages' profiles, and as Ruby printed it before 3.4.
func qualified(class, label string, singleton bool) string {
	if class == "" || class == "Object" && !singleton || strings.HasPrefix(label, class+"#") || strings.HasPrefix(label, class+".") {
		return label
	}
	if singleton {
		return class + "." + label
	}
	return class + "#" + label
}

// classPath returns the name of a method's owner ("Orchard", "Fruit::Basket"), and
// whether the method is a singleton method of it; "" where it cannot be read, or the class
// is anonymous.
func (img *Image) classPath(m Memory, klass uint64) (string, bool) {
	singleton := false
	for range maxClassNest {
		var head [16]byte
		if klass == 0 || m.ReadAt(head[:], klass) != nil {
			return "", false
		}
		flags := binary.LittleEndian.Uint64(head[:])
		switch flags & typeMask {
		case typeIClass:
			klass = binary.LittleEndian.Uint64(head[rbasicKlass:])
			continue
		case typeClass, typeModule:
		default:
			return "", false
		}
		if flags&img.Layout.FlSingleton != 0 {
			attached, ok := img.classAttached(m, klass)
			if !ok || singleton {
				return "", false
			}
			singleton, klass = true, attached
			continue
		}
		path, ok := img.classPathOf(m, klass)
		if !ok {
			return "", false
		}
		return path, singleton
	}
	return "", false
}

// classPathOf reads a named class's path: a field of its extension since 3.3, its
// __classpath__ instance variable before.
func (img *Image) classPathOf(m Memory, klass uint64) (string, bool) {
	l := img.Layout
	var v uint64
	switch {
	case l.ClassPath > 0:
		var err error
		if v, err = procmem.ReadU64(m, klass+uint64(l.ClassPath)); err != nil {
			return "", false
		}
	case l.ClassExtPtr > 0:
		var ok bool
		if v, ok = img.classIvar(m, klass, "__classpath__"); !ok {
			return "", false
		}
	default:
		return "", false
	}
	if v == 0 || v&7 != 0 {
		return "", false // nil or another immediate: anonymous
	}
	s, err := img.readString(m, v)
	return s, err == nil && s != ""
}

// classAttached returns the object a singleton class belongs to: a field of its extension
// since 3.3, its __attached__ instance variable before.
func (img *Image) classAttached(m Memory, klass uint64) (uint64, bool) {
	l := img.Layout
	switch {
	case l.ClassAttached > 0:
		v, err := procmem.ReadU64(m, klass+uint64(l.ClassAttached))
		return v, err == nil && v != 0 && v&7 == 0
	case l.ClassExtPtr > 0:
		return img.classIvar(m, klass, "__attached__")
	}
	return 0, false
}

// classIvar reads a class's instance variable by name, from its iv_tbl (3.1: an st_table
// of ID to VALUE behind the class's extension), where IDs can be named.
func (img *Image) classIvar(m Memory, klass uint64, name string) (uint64, bool) {
	l := img.Layout
	ext, err := procmem.ReadU64(m, klass+uint64(l.ClassExtPtr))
	if err != nil || ext == 0 {
		return 0, false
	}
	tbl, err := procmem.ReadU64(m, ext+uint64(l.ExtIvTbl))
	if err != nil || tbl == 0 {
		return 0, false
	}
	var st [stEntries + 8]byte
	if m.ReadAt(st[:], tbl) != nil {
		return 0, false
	}
	start, bound := binary.LittleEndian.Uint64(st[32:]), binary.LittleEndian.Uint64(st[40:])
	entries := binary.LittleEndian.Uint64(st[stEntries:])
	if bound < start || bound-start > maxIvarEntries || entries == 0 {
		return 0, false
	}
	b := make([]byte, (bound-start)*stEntrySize)
	if m.ReadAt(b, entries+start*stEntrySize) != nil {
		return 0, false
	}
	for e := b; len(e) >= stEntrySize; e = e[stEntrySize:] {
		if key := binary.LittleEndian.Uint64(e[8:]); key != 0 {
			if n, err := img.idName(m, key); err == nil && n == name {
				return binary.LittleEndian.Uint64(e[16:]), true
			}
		}
	}
	return 0, false
}

// idName reads the name of an ID from the VM's global symbol table.
func (img *Image) idName(m Memory, id uint64) (string, error) {
	if img.symbols == 0 {
		return "", errors.New("the VM's symbol table is not known")
	}
	serial := id
	if id > img.lastOpID {
		serial = id >> idScopeShift
	}
	last, err := procmem.ReadU64(m, img.symbols)
	if err != nil {
		return "", err
	}
	if serial == 0 || serial > uint64(uint32(last)) {
		return "", fmt.Errorf("id %#x: serial %d past the last, %d", id, serial, uint32(last))
	}
	ids, err := procmem.ReadU64(m, img.symbols+symIDsOffset)
	if err != nil {
		return "", err
	}
	chunk, err := img.arrayElement(m, ids, serial/idEntryUnit)
	if err != nil {
		return "", fmt.Errorf("id %#x: %w", id, err)
	}
	str, err := img.arrayElement(m, chunk, serial%idEntryUnit*idEntrySize)
	if err != nil {
		return "", fmt.Errorf("id %#x: %w", id, err)
	}
	return img.readString(m, str)
}

// arrayElement reads element i of a Ruby Array.
func (img *Image) arrayElement(m Memory, ary, i uint64) (uint64, error) {
	l := img.Layout
	var h [40]byte
	if err := m.ReadAt(h[:], ary); err != nil {
		return 0, err
	}
	flags := binary.LittleEndian.Uint64(h[:])
	if flags&typeMask != typeArray {
		return 0, fmt.Errorf("array at %#x: type %#x", ary, flags&typeMask)
	}
	var first, n uint64
	if flags&flNoEmbed != 0 { // RARRAY_EMBED_FLAG: the elements are in place, their count in the flags
		first, n = ary+uint64(l.AryEmbed), flags>>aryEmbedLenShift&l.AryEmbedLenMask
	} else {
		first, n = binary.LittleEndian.Uint64(h[l.AryPtr:]), binary.LittleEndian.Uint64(h[16:])
	}
	if i >= n {
		return 0, fmt.Errorf("array at %#x: element %d of %d", ary, i, n)
	}
	return procmem.ReadU64(m, first+8*i)
}

// aryEmbedLenShift is where RArray's embedded length starts in its flags (FL_USER3).
const aryEmbedLenShift = 15

// globalSymbols finds ruby_global_symbols, which no build exports, from rb_id2str, which
// every build does: it jumps to (or inlines) the lookup, which compares the ID's serial
// with the table's last_id and loads its ids array, RIP-relative both. It returns
// last_id's address and the highest operator ID, which rb_id2str compares the ID with
// before it shifts it to a serial.
func globalSymbols(f *elf.File) (symbols, lastOpID uint64) {
	s, ok, _ := objfile.FindSymbol(f, elf.SHT_DYNSYM, "rb_id2str", true)
	if !ok || s.Value == 0 || s.Size == 0 || s.Size > maxExecRead {
		return 0, 0
	}
	var lastID, ids uint64
	follow := uint64(0)
	scan := func(start, size uint64) {
		code, err := objfile.ReadVaddr(f, start, size)
		if err != nil {
			return
		}
		interp.DecodeX86(code, start, func(in x86asm.Inst, next uint64) bool {
			if in.Op == x86asm.CMP {
				if imm, ok := in.Args[1].(x86asm.Imm); ok && lastOpID == 0 && imm > 0x80 && imm < 0x400 {
					lastOpID = uint64(imm)
				}
				for _, a := range in.Args[:2] {
					if mem, ok := a.(x86asm.Mem); ok && mem.Base == x86asm.RIP && lastID == 0 {
						lastID = uint64(int64(next) + mem.Disp)
					}
				}
			}
			if in.Op == x86asm.MOV && lastID != 0 {
				if mem, ok := in.Args[1].(x86asm.Mem); ok && mem.Base == x86asm.RIP {
					ids = uint64(int64(next) + mem.Disp)
					return false
				}
			}
			if in.Op == x86asm.JMP && lastID == 0 && follow == 0 {
				if rel, ok := in.Args[0].(x86asm.Rel); ok {
					follow = next + uint64(int64(rel))
					return false
				}
			}
			return true
		})
	}
	scan(s.Value, s.Size)
	if lastID == 0 && follow != 0 {
		scan(follow, 512)
	}
	if lastID == 0 || ids != lastID+symIDsOffset || lastOpID == 0 {
		return 0, 0
	}
	return lastID, lastOpID
}
