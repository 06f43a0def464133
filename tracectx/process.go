package tracectx

import (
	"debug/elf"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/objfile"
)

// ProcMem reads a process's memory with process_vm_readv, which fails cleanly where the
// process unmapped what it pointed at, as the OTEP recommends.
type ProcMem int

// ReadAt reads len(p) bytes at addr of the process.
func (m ProcMem) ReadAt(p []byte, addr uint64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	local := []unix.Iovec{{Base: &p[0]}}
	local[0].SetLen(len(p))
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(p)}}
	n, err := unix.ProcessVMReadv(int(m), local, remote, 0)
	if err != nil {
		return n, fmt.Errorf("read %d bytes at %#x of pid %d: %w", len(p), addr, int(m), err)
	}
	return n, nil
}

// Kernel is what the kernel needs to read a process's trace context; the zero Kernel
// reads nothing.
type Kernel struct {
	// TLS, when HasTLS, is where otel_thread_ctx_v1 is.
	HasTLS bool
	TLS    Where
	// Go, when not nil, is where the Go runtime keeps the goroutine's labels.
	Go *GoRuntime
}

// Published says whether the kernel has somewhere to read a thread's context: the zero
// Kernel says nowhere.
func (k Kernel) Published() bool { return k.HasTLS || k.Go != nil }

// Mapping is an executable mapping of a process, as the caller read /proc/PID/maps.
type Mapping struct {
	File          *objfile.File // nil for anonymous mappings
	Start, Offset uint64
	Path          string
}

// State is what was read of one exec of a process.
type State struct {
	// ContextAddr is the process context's mapping; 0: none seen.
	ContextAddr uint64
	PublishedAt uint64
	// Context is the latest process context read whole; nil until one is.
	Context *ProcessContext
	Kernel  Kernel
	// MayPublish: the process may publish a context later (it maps a module defining
	// otel_thread_ctx_v1, or runs Go): worth looking again for one.
	MayPublish bool
	// Err is why the latest look was incomplete, for logs.
	Err error
}

// fileInfo is what one file says about trace context, read once.
type fileInfo struct {
	tls   *TLSSymbol
	goRT  *GoRuntime
	loads []elf.ProgHeader
	err   error
}

// Reader looks at processes for trace context. Its methods are for one goroutine: the
// process tracker's, which reads /proc anyway.
type Reader struct {
	files map[objfile.ID]*fileInfo
	// mem opens a process's memory; ProcMem outside tests.
	mem func(pid uint32) Memory
	// Stats counts what was found.
	Stats ReaderStats
}

// ReaderStats count a Reader's findings.
type ReaderStats struct {
	Files         uint64 // files examined
	FileErrors    uint64 // files whose trace context support could not be read
	TLSModules    uint64 // files defining otel_thread_ctx_v1
	GoPrograms    uint64 // Go programs whose labels sonde can read
	Contexts      uint64 // process contexts read whole
	ContextErrors uint64 // process contexts invalid, oversized or torn
}

// maxFiles bounds the files remembered; past it the cache starts over.
const maxFiles = 16384

// NewReader returns a Reader of live processes.
func NewReader() *Reader {
	return &Reader{files: map[objfile.ID]*fileInfo{}, mem: func(pid uint32) Memory { return ProcMem(pid) }}
}

// file reads, once per file identity, the file's TLS symbol and Go runtime.
func (r *Reader) file(f *objfile.File) *fileInfo {
	id := f.ID()
	if fi, ok := r.files[id]; ok {
		return fi
	}
	if len(r.files) >= maxFiles {
		clear(r.files)
	}
	fi := &fileInfo{}
	r.files[id] = fi
	r.Stats.Files++
	h, err := f.Open()
	if err != nil {
		fi.err = err
		r.Stats.FileErrors++
		return fi
	}
	defer h.Close()
	// Mapped: the symbol tables scanned here are read in place, not copied to the heap.
	ef, region, err := h.MapELF()
	if err != nil {
		fi.err = err
		r.Stats.FileErrors++
		return fi
	}
	defer region.Close()
	if fault := mmapfile.Guard(func() { r.inspect(f, fi, ef, h) }); fault != nil {
		fi.err = fault
		r.Stats.FileErrors++
	}
	return fi
}

// inspect reads what fi records from the mapped file ef.
func (r *Reader) inspect(f *objfile.File, fi *fileInfo, ef *elf.File, h *objfile.Handle) {
	var err error
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			fi.loads = append(fi.loads, p.ProgHeader)
		}
	}
	var errs []error
	if fi.tls, err = FindTLS(ef); err != nil {
		errs = append(errs, err)
	} else if fi.tls != nil {
		r.Stats.TLSModules++
	}
	if f.IsGo {
		if fi.goRT, err = ReadGoRuntime(ef, h); err != nil {
			errs = append(errs, err)
		} else {
			r.Stats.GoPrograms++
		}
	}
	if fi.err = errors.Join(errs...); fi.err != nil {
		r.Stats.FileErrors++
	}
}

// bias is run-time minus ELF address for a mapping of a file with these segments.
func bias(loads []elf.ProgHeader, m Mapping) (uint64, bool) {
	for _, p := range loads {
		if m.Offset >= p.Off && m.Offset < p.Off+max(p.Filesz, 1) {
			return m.Start - (p.Vaddr + (m.Offset - p.Off)), true
		}
	}
	return 0, false
}

// Update looks at one exec of pid: its mappings (exe first is not required), the address
// of its process context mapping (0: none), and what was read of it before (nil: nothing).
// It returns the new state; the caller tells the kernel when its Kernel changed.
func (r *Reader) Update(pid uint32, prev *State, mappings []Mapping, contextAddr uint64) *State {
	st := &State{}
	if prev != nil {
		*st = *prev
	}
	st.Err = nil
	var tlsMod *fileInfo
	var tlsMap Mapping
	var goRT *GoRuntime
	musl := false
	for _, m := range mappings {
		if base := filepath.Base(m.Path); strings.HasPrefix(base, "ld-musl-") || strings.HasPrefix(base, "libc.musl-") {
			musl = true
		}
		if m.File == nil {
			continue
		}
		fi := r.file(m.File)
		if fi.tls != nil && tlsMod == nil {
			tlsMod, tlsMap = fi, m
		}
		if fi.goRT != nil && goRT == nil {
			goRT = fi.goRT
		}
	}
	st.MayPublish = tlsMod != nil || goRT != nil
	mem := r.mem(pid)
	if contextAddr != 0 {
		if contextAddr != st.ContextAddr {
			st.ContextAddr, st.PublishedAt = contextAddr, 0
		}
		pc, at, err := ReadProcessContext(mem, contextAddr, st.PublishedAt)
		switch {
		case err != nil:
			r.Stats.ContextErrors++
			st.Err = fmt.Errorf("process context: %w", err)
		case pc != nil:
			r.Stats.Contexts++
			st.Context, st.PublishedAt = pc, at
		}
	}
	k := Kernel{Go: goRT}
	// TLS discovery waits for the process context to announce the thread context: before
	// that the key map is unknown, and the variable may not be set up.
	if tlsMod != nil && st.Context.ThreadContext() {
		libc := Glibc
		if musl {
			libc = Musl
		}
		b, ok := bias(tlsMod.loads, tlsMap)
		if !ok {
			st.Err = errors.Join(st.Err, fmt.Errorf("%s: mapping at offset %#x in no segment", tlsMap.Path, tlsMap.Offset))
		} else if w, err := tlsMod.tls.Resolve(mem, b, libc); err != nil {
			st.Err = errors.Join(st.Err, fmt.Errorf("%s in %s: %w", SymbolName, tlsMap.Path, err))
		} else {
			k.HasTLS, k.TLS = true, w
		}
	}
	st.Kernel = k
	return st
}
