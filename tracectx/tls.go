package tracectx

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// SymbolName is the TLS variable OTEP 4947 names.
const SymbolName = "otel_thread_ctx_v1"

// TLSAccess is how a module reaches its otel_thread_ctx_v1, which decides how a reader
// finds it: the OTEP asks readers to handle TLSDESC, the legacy global-dynamic model, and
// the static models a linker relaxes to in an executable.
type TLSAccess uint8

const (
	// LocalExec: in the executable's static TLS block, at an offset the file gives.
	LocalExec TLSAccess = iota + 1
	// InitialExec: a GOT slot the loader fills with the thread-pointer offset.
	InitialExec
	// TLSDesc: a TLS descriptor in the GOT whose argument the loader fills with the
	// thread-pointer offset (static TLS) or a pointer to the module id and offset.
	TLSDesc
	// GlobalDynamic: a GOT pair the loader fills with the module id and offset.
	GlobalDynamic
)

func (a TLSAccess) String() string {
	switch a {
	case LocalExec:
		return "local-exec"
	case InitialExec:
		return "initial-exec"
	case TLSDesc:
		return "tlsdesc"
	case GlobalDynamic:
		return "global-dynamic"
	}
	return "unknown"
}

// TLSSymbol is where a module keeps otel_thread_ctx_v1.
type TLSSymbol struct {
	Access  TLSAccess
	Machine elf.Machine
	// GOT is the ELF address of the GOT slot or descriptor (all but LocalExec).
	GOT uint64
	// Offset is the thread-pointer offset (LocalExec), or the offset within the module's
	// block when the loader fills in only the module id (GlobalDynamic against the
	// module rather than the symbol).
	Offset int64
	// ModuleOnly: the GOT pair's second word is not the variable's offset, Offset is.
	ModuleOnly bool
}

// ErrUnsupported: something a reader of this architecture or libc cannot follow.
var ErrUnsupported = errors.New("unsupported")

// FindTLS looks for otel_thread_ctx_v1 in a module's dynamic symbols and works out how the
// module reaches it. It returns nil without error when the module does not define it.
func FindTLS(f *elf.File) (*TLSSymbol, error) { return FindTLSVariable(f, SymbolName) }

// FindTLSVariable looks for a pointer-sized TLS variable a module defines in its dynamic
// symbols (otel_thread_ctx_v1, CRuby's ruby_current_ec) and works out how the module
// reaches it. It returns nil without error when the module does not define it.
func FindTLSVariable(f *elf.File, name string) (*TLSSymbol, error) {
	if s := f.SectionByType(elf.SHT_DYNSYM); s != nil && s.Size > maxDynamicSymbols*24 {
		return nil, fmt.Errorf(".dynsym of %d bytes: %w", s.Size, ErrOversized)
	}
	sym, found, err := objfile.FindSymbol(f, elf.SHT_DYNSYM, name, true)
	if err != nil {
		return nil, fmt.Errorf("read .dynsym: %w", err)
	}
	if !found {
		return nil, nil
	}
	index := sym.Index // relocations count the null symbol as 0, as Index does
	if elf.ST_TYPE(sym.Info) != elf.STT_TLS {
		return nil, fmt.Errorf("%s is not a TLS symbol: %w", name, ErrInvalid)
	}
	if sym.Size != 8 {
		return nil, fmt.Errorf("%s has %d bytes, not a pointer's 8: %w", name, sym.Size, ErrInvalid)
	}
	t := &TLSSymbol{Machine: f.Machine}
	tlsdesc, dtpmod, tpoff := relocTypes(f.Machine)
	if tlsdesc == 0 {
		return nil, fmt.Errorf("TLS on %v: %w", f.Machine, ErrUnsupported)
	}
	// Relocations against the symbol first; a module that binds it locally relocates
	// against itself (symbol 0) with the variable's offset as addend.
	var local *TLSSymbol
	err = eachRela(f, func(off uint64, typ uint32, symIndex uint32, addend int64) bool {
		var access TLSAccess
		switch typ {
		case tlsdesc:
			access = TLSDesc
		case dtpmod:
			access = GlobalDynamic
		case tpoff:
			access = InitialExec
		default:
			return true
		}
		switch {
		case symIndex == uint32(index):
			t.Access, t.GOT = access, off
			return false
		case symIndex == 0 && local == nil && addend == int64(sym.Value) && access != InitialExec:
			local = &TLSSymbol{Machine: f.Machine, Access: access, GOT: off, Offset: int64(sym.Value), ModuleOnly: access == GlobalDynamic}
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	switch {
	case t.Access != 0:
		return t, nil
	case local != nil:
		return local, nil
	case isExecutable(f):
		off, err := staticOffset(f, sym.Value)
		if err != nil {
			return nil, err
		}
		t.Access, t.Offset = LocalExec, off
		return t, nil
	}
	return nil, fmt.Errorf("%s: no relocation reaches it and the module is no executable: %w", name, ErrUnsupported)
}

func relocTypes(m elf.Machine) (tlsdesc, dtpmod, tpoff uint32) {
	switch m {
	case elf.EM_X86_64:
		return uint32(elf.R_X86_64_TLSDESC), uint32(elf.R_X86_64_DTPMOD64), uint32(elf.R_X86_64_TPOFF64)
	case elf.EM_AARCH64:
		return uint32(elf.R_AARCH64_TLSDESC), uint32(elf.R_AARCH64_TLS_DTPMOD64), uint32(elf.R_AARCH64_TLS_TPREL64)
	}
	return 0, 0, 0
}

// maxDynamicSymbols bounds the dynamic symbol table read: the largest libraries export
// a few hundred thousand.
const maxDynamicSymbols = 4 << 20

// eachRela calls fn for each RELA relocation of the module's dynamic relocation sections
// until fn returns false.
func eachRela(f *elf.File, fn func(off uint64, typ, sym uint32, addend int64) bool) error {
	for _, s := range f.Sections {
		if s.Type != elf.SHT_RELA || f.Class != elf.ELFCLASS64 {
			continue
		}
		if link := int(s.Link); link <= 0 || link >= len(f.Sections) || f.Sections[link].Type != elf.SHT_DYNSYM {
			continue
		}
		b, err := objfile.SectionData(s, objfile.MaxSectionSize)
		if err != nil {
			return err
		}
		for ; len(b) >= 24; b = b[24:] {
			info := f.ByteOrder.Uint64(b[8:])
			if !fn(f.ByteOrder.Uint64(b), uint32(info), uint32(info>>32), int64(f.ByteOrder.Uint64(b[16:]))) {
				return nil
			}
		}
	}
	return nil
}

// isExecutable tells an executable (static TLS at a fixed place) from a shared library: a
// PIE executable is ET_DYN too, told by DF_1_PIE or, from older linkers, an interpreter.
func isExecutable(f *elf.File) bool {
	if f.Type == elf.ET_EXEC {
		return true
	}
	if vals, err := f.DynValue(elf.DT_FLAGS_1); err == nil {
		for _, v := range vals {
			if v&uint64(elf.DF_1_PIE) != 0 {
				return true
			}
		}
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

// staticOffset is the thread-pointer offset of a variable at value in the executable's
// TLS segment. x86-64 puts the executable's block just below the thread pointer, its size
// rounded up to its alignment; arm64 puts it above a 16-byte control block, aligned.
func staticOffset(f *elf.File, value uint64) (int64, error) {
	var tls *elf.Prog
	for _, p := range f.Progs {
		if p.Type == elf.PT_TLS {
			tls = p
		}
	}
	if tls == nil {
		return 0, fmt.Errorf("a TLS symbol but no TLS segment: %w", ErrInvalid)
	}
	align := max(tls.Align, 1)
	if align&(align-1) != 0 || align > 1<<20 || tls.Memsz > 1<<30 || value >= tls.Memsz {
		return 0, fmt.Errorf("TLS segment of %d bytes aligned to %d, variable at %d: %w", tls.Memsz, tls.Align, value, ErrInvalid)
	}
	roundUp := func(v uint64) uint64 { return (v + align - 1) &^ (align - 1) }
	switch f.Machine {
	case elf.EM_X86_64:
		return int64(value) - int64(roundUp(tls.Memsz)), nil
	case elf.EM_AARCH64:
		return int64(roundUp(16) + value), nil
	}
	return 0, fmt.Errorf("static TLS on %v: %w", f.Machine, ErrUnsupported)
}

// Libc says whose TLS layout a process has: the DTV's place and entries differ.
type Libc uint8

const (
	Glibc Libc = iota
	Musl
)

// Where is what the kernel needs to find a thread's otel_thread_ctx_v1 (bpf.TraceContextProc).
type Where struct {
	Dynamic bool  // through the DTV
	Offset  int64 // static: from the thread pointer; dynamic: in the module's block
	Module  uint64
	// DTV layout, when Dynamic: the DTV pointer at the thread pointer plus DTVOffset,
	// entries of 1<<DTVShift bytes, the length at entry DTVLen (0: not checked).
	DTVOffset int32
	DTVLen    int32
	DTVShift  uint8
}

// maxModules bounds a plausible TLS module id: one read from a GOT the loader had not
// filled yet, or from a lazy descriptor, is a pointer or garbage.
const maxModules = 1 << 16

// Resolve finds where the variable is in one process, whose module was loaded with bias
// (run-time address minus ELF address), reading the GOT the loader filled.
func (t *TLSSymbol) Resolve(m Memory, bias uint64, libc Libc) (Where, error) {
	var w Where
	word := func(addr uint64) (uint64, error) {
		var b [8]byte
		if err := readFull(m, b[:], addr); err != nil {
			return 0, err
		}
		return binary.NativeEndian.Uint64(b[:]), nil
	}
	switch t.Access {
	case LocalExec:
		w.Offset = t.Offset
		return w, nil
	case InitialExec:
		off, err := word(bias + t.GOT)
		if err != nil {
			return w, fmt.Errorf("read TLS offset from the GOT: %w", err)
		}
		w.Offset = int64(off)
		return w, nil
	case TLSDesc:
		arg, err := word(bias + t.GOT + 8)
		if err != nil {
			return w, fmt.Errorf("read TLS descriptor: %w", err)
		}
		// In static TLS the argument is the offset: negative on x86-64, and on arm64 well
		// below any address a loader allocates. Otherwise it points at the module id
		// and the offset.
		static := int64(arg) < 0
		if t.Machine == elf.EM_AARCH64 {
			static = arg < 1<<32
		}
		if static {
			w.Offset = int64(arg)
			if t.ModuleOnly {
				w.Offset += t.Offset
			}
			return w, nil
		}
		mod, err1 := word(arg)
		off, err2 := word(arg + 8)
		if err := errors.Join(err1, err2); err != nil {
			return w, fmt.Errorf("read dynamic TLS descriptor: %w", err)
		}
		return t.dynamic(mod, int64(off), libc)
	case GlobalDynamic:
		mod, err1 := word(bias + t.GOT)
		off, err2 := word(bias + t.GOT + 8)
		if err := errors.Join(err1, err2); err != nil {
			return w, fmt.Errorf("read TLS module from the GOT: %w", err)
		}
		if t.ModuleOnly {
			off = uint64(t.Offset)
		}
		return t.dynamic(mod, int64(off), libc)
	}
	return w, fmt.Errorf("TLS access %v: %w", t.Access, ErrUnsupported)
}

func (t *TLSSymbol) dynamic(mod uint64, off int64, libc Libc) (Where, error) {
	w := Where{Dynamic: true, Module: mod, Offset: off}
	if mod == 0 || mod >= maxModules || off < 0 || off >= 1<<30 {
		return w, fmt.Errorf("TLS module %d offset %d: %w", mod, off, ErrInvalid)
	}
	switch {
	case t.Machine == elf.EM_X86_64 && libc == Glibc:
		// tcbhead_t: tcb, dtv; dtv_t entries of a pointer and a flag, the length in dtv[-1].
		w.DTVOffset, w.DTVShift, w.DTVLen = 8, 4, -1
	case t.Machine == elf.EM_X86_64 && libc == Musl:
		// struct pthread: self, dtv; entries are pointers, the count in dtv[0].
		w.DTVOffset, w.DTVShift, w.DTVLen = 8, 3, 0
	case t.Machine == elf.EM_AARCH64 && libc == Glibc:
		w.DTVOffset, w.DTVShift, w.DTVLen = 0, 4, -1
	default:
		return w, fmt.Errorf("dynamic TLS on %v with this libc: %w", t.Machine, ErrUnsupported)
	}
	return w, nil
}

var _ io.ReaderAt = (*objfile.Handle)(nil)
