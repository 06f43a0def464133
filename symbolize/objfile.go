package symbolize

import (
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ianlancetaylor/demangle"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/symbolize/dwarf"
	"github.com/sonde-profiler/sonde/symbolize/gopclntab"
	"github.com/sonde-profiler/sonde/trace"
)

// Where a location's name came from, as trace.Location.NameSource records it. A runtime's
// frame names its source by the runtime's frame type: its code, read from its process.
const (
	SourceSymtab    = "symtab"    // the ELF .symtab, of the file or of its separate debug file
	SourceDynsym    = "dynsym"    // the ELF .dynsym: exported names only
	SourceDWARF     = "dwarf"     // DWARF line tables and inlined subroutines
	SourceGopclntab = "gopclntab" // Go's runtime tables
	SourceKallsyms  = "kallsyms"  // /proc/kallsyms
	SourceNone      = "none"      // nothing named it: the frame keeps its address and build ID
)

// objFile is everything one object file's names come from, read once and kept while
// the file cache holds it. Its tables are immutable.
type objFile struct {
	syms   *ELFSymbols
	dwarf  *dwarf.Table     // nil without DWARF, or in symtab mode
	gopcln *gopclntab.Table // nil unless a Go binary
	// unnamed names what no symbol does: PLT entries, and a stripped object's functions
	// by their FDEs; nil when there is nothing of the kind.
	unnamed *unnamedCode
	// debugPath is the separate debug file the names came from too, if any.
	debugPath string
	size      int64 // estimated bytes held
	// maps are the file and its debug file, mapped; the tables read from them in
	// place. nil entries are files that could not be mapped, whose tables were read.
	maps []*mmapfile.Region
	// faulted says reading a mapping faulted: the file changed on disk, and is
	// being dropped. lookupFailed says a lookup's error was returned already.
	faulted, lookupFailed bool
	releasedAt            time.Time // when the mappings' resident pages were last given back
	// lookupsHeld counts the lookups since the pages were last given back (see
	// releaseLookups).
	lookupsHeld int
	// dwarfReadAt is when a lookup last read the DWARF sections (decoded a unit),
	// dwarfReads the table's count of such reads then.
	dwarfReadAt time.Time
	dwarfReads  uint64
	// dwarfIdle is how long the decompressed sections stay after the last read (0:
	// dwarfIdleMin); dwarfLetGo says they were let go since the last read.
	dwarfIdle  time.Duration
	dwarfLetGo bool
	// dwarfPasses counts the passes that read the sections, each within dwarfIdle of
	// the one before; dwarfLoaded says the pass now running loaded the file.
	dwarfPasses int
	dwarfLoaded bool
	// awaitID is the build ID whose debug file the DebugFetcher was asked for and
	// did not have yet.
	awaitID string
}

type loadOptions struct {
	mode         Mode
	debugDirs    []string
	maxDebugInfo int64
	units        *dwarf.Cache // where DWARF lookups keep the units they decode
	fetcher      DebugFetcher // nil: debug files are looked for on this host only
}

// loadObjFile reads f. It returns a nil objFile when f cannot be read at all, and a
// usable one with an error when only debug information could not be used: the
// symbol tables still name its frames.
func loadObjFile(f *objfile.File, o loadOptions, want []uint64) (*objFile, error) {
	r, err := f.Open()
	if err != nil {
		return nil, err // names the path already
	}
	defer r.Close()
	obj := &objFile{}
	loaded := false
	defer func() {
		if !loaded { // a failure, or a fault reading a mapping (see Symbolizer.object)
			obj.close()
		}
	}()
	m := mapFile(r)
	obj.maps = append(obj.maps, m)
	// Parsed over the mapping, the file's sections are read where they lie: a large
	// library's relocation and symbol tables are not copied to the heap to name it.
	var ef *elf.File
	if m != nil {
		ef, err = objfile.MappedELF(m.Bytes())
	} else {
		ef, err = objfile.NewELF(r)
	}
	if err != nil {
		return nil, fmt.Errorf("read symbols of %s: %w", f.Path, err)
	}
	var errs []error
	var syms symbolReader
	if err := syms.read(ef, m.Bytes(), m, true); err != nil {
		if syms.empty() && ef.Section(".gopclntab") == nil {
			return nil, fmt.Errorf("read symbols of %s: %w", f.Path, err)
		}
		errs = append(errs, fmt.Errorf("read symbols of %s: %w", f.Path, err))
	}
	// Go's tables are complete and cheap next to a Go binary's DWARF, and they
	// survive stripping, so Go binaries are named from them alone; cgo's C code
	// falls back to the symbol table.
	if ef.Section(".gopclntab") != nil || f.IsGo {
		t, err := gopclntab.Load(ef, m.Bytes())
		switch {
		case err == nil:
			obj.gopcln = t
		case errors.Is(err, gopclntab.ErrNotGo):
		default:
			errs = append(errs, fmt.Errorf("read go tables of %s: %w", f.Path, err))
		}
	}
	if obj.gopcln == nil {
		dwarfFrom, dwarfFile, dwarfMap := ef, m.Bytes(), m
		needDebugFile := ef.Section(".symtab") == nil || (o.mode == ModeFull && !dwarf.HasDWARF(ef))
		if needDebugFile {
			d, err := findDebugFile(ef, r, f.GNUBuildID, f.Path, o.debugDirs)
			if err != nil {
				errs = append(errs, fmt.Errorf("find debug file of %s: %w", f.Path, err))
			}
			if d == nil && o.fetcher != nil {
				buildID := cmp.Or(f.GNUBuildID, objfile.GNUBuildID(ef))
				var awaiting bool
				if d, awaiting, err = fetchedDebugFile(o.fetcher, buildID); err != nil {
					errs = append(errs, fmt.Errorf("fetched debug file of %s: %w", f.Path, err))
				}
				if awaiting {
					obj.awaitID = buildID
				}
			}
			if d != nil {
				defer d.Close()
				dm := mapFile(d.file)
				obj.maps = append(obj.maps, dm)
				// A debug file's .dynsym is empty (NOBITS): its .symtab is what adds names.
				if err := syms.read(d.elf, dm.Bytes(), dm, false); err != nil {
					errs = append(errs, fmt.Errorf("read symbols of %s: %w", d.path, err))
				}
				obj.debugPath, dwarfFrom, dwarfFile, dwarfMap = d.path, d.elf, dm.Bytes(), dm
			}
		}
		if o.mode == ModeFull && dwarf.HasDWARF(dwarfFrom) {
			segs := &ELFSymbols{loads: loadSegments(ef)}
			t, err := dwarf.Load(dwarfFrom, dwarf.Options{MaxBytes: o.maxDebugInfo, File: dwarfFile, Release: dwarfMap.Release,
				Cache: o.units, Want: vaddrs(segs, want)})
			if err != nil {
				where := f.Path
				if dwarfFrom != ef {
					where = obj.debugPath
				}
				errs = append(errs, fmt.Errorf("read dwarf of %s: %w", where, err))
			} else {
				obj.dwarf = t
			}
		}
	}
	var goCode func(uint64) bool
	if obj.gopcln != nil {
		goCode = obj.gopcln.Covers
	}
	obj.syms = &ELFSymbols{Funcs: syms.table(goCode), loads: loadSegments(ef)}
	obj.unnamed = readUnnamed(ef, f.Path)
	obj.size = obj.sizeBytes()
	loaded = true
	return obj, errors.Join(errs...)
}

// vaddrs converts file offsets to the addresses the code has in the file.
func vaddrs(segs *ELFSymbols, offs []uint64) []uint64 {
	out := make([]uint64, 0, len(offs))
	for _, off := range offs {
		if a, ok := segs.Vaddr(off); ok {
			out = append(out, a)
		}
	}
	return out
}

// prepare has DWARF fetch at once what looking up the file offsets offs needs.
// The error is left to the lookups, which meet it again.
func (o *objFile) prepare(offs []uint64) {
	if o.dwarf == nil || o.faulted || len(offs) == 0 {
		return
	}
	_ = o.dwarf.Prepare(vaddrs(o.syms, offs))
}

// lookup names the code at an offset in the file, innermost frame first. The error
// says why DWARF could not be read there; the symbol table named the code then.
// It reads mapped files: the caller runs it under mmapfile.Guard.
func (o *objFile) lookup(off uint64) ([]trace.Line, string, error) {
	vaddr, ok := o.syms.Vaddr(off)
	if !ok || o.faulted {
		return nil, SourceNone, nil
	}
	if o.gopcln != nil {
		if frames := o.gopcln.Lookup(vaddr); len(frames) > 0 {
			lines := make([]trace.Line, len(frames))
			for i, f := range frames {
				// Go's names are not mangled: the stored name is the readable one.
				lines[i] = trace.Line{Function: f.Function, SystemName: f.Function, File: f.File, Line: f.Line}
			}
			return lines, SourceGopclntab, nil
		}
	}
	sym, hasSym := o.syms.Funcs.Lookup(vaddr)
	// A symbol's name points into the table's one string of all names, or into the
	// mapped file; the address cache outlives both.
	sym.Name = strings.Clone(sym.Name)
	var err error
	if o.dwarf != nil {
		var lines []trace.Line
		var src string
		if lines, src, err = o.dwarfLines(vaddr, sym, hasSym); lines != nil {
			return lines, src, nil
		}
	}
	if hasSym {
		return namedLine(sym.Name), symbolSource(sym), err
	}
	if o.unnamed != nil {
		lines, source := o.unnamed.lookup(vaddr)
		return lines, source, err
	}
	return nil, SourceNone, err
}

func (o *objFile) dwarfLines(vaddr uint64, sym Symbol, hasSym bool) ([]trace.Line, string, error) {
	frames, err := o.dwarf.Lookup(vaddr)
	if len(frames) == 0 {
		return nil, "", err
	}
	src := SourceDWARF
	outer := &frames[len(frames)-1]
	switch {
	case outer.Name == "" && hasSym:
		// A line without a function, as assembly has: the symbol names it.
		outer.Name = sym.Name
		if len(frames) == 1 {
			src = symbolSource(sym)
		}
	case outer.Name == "":
		return nil, "", nil
	case hasSym && !outer.Linkage && sym.Value == outer.Entry:
		// A plain DW_AT_name lacks the namespaces, parameters and clone suffixes a
		// C++ symbol spells; binutils prefers the symbol starting at the function too.
		outer.Name = sym.Name
	}
	lines := make([]trace.Line, len(frames))
	for i, f := range frames {
		lines[i] = trace.Line{Function: demangle.Filter(f.Name), SystemName: f.Name, File: f.File, Line: f.Line}
	}
	return lines, src, nil
}

func symbolSource(s Symbol) string {
	if s.Dynamic {
		return SourceDynsym
	}
	return SourceSymtab
}
