package tracectx

import (
	"debug/buildinfo"
	"debug/dwarf"
	"debug/elf"
	"errors"
	"fmt"
	"go/version"
	"io"
	"strings"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// GoRuntime is where a Go program keeps the running goroutine's pprof labels.
type GoRuntime struct {
	Version string // as the build info says, e.g. go1.23.4
	// SliceLabels: since Go 1.24 g.labels points at a sorted slice of key/value
	// strings; before, at a map[string]string.
	SliceLabels bool
	// GOffset is where the running g is, from the thread pointer.
	GOffset int32
	// Offsets of g.m, m.curg and g.labels.
	GM, MCurg, GLabels uint32
	// FromDWARF says the offsets came from the binary's DWARF, not the version table.
	FromDWARF bool
}

// goOffsets are g.m, m.curg and g.labels by Go release on amd64, for binaries without
// DWARF. Each comes from the DWARF of a program built by that release, read by
// ReadGoRuntime (TestGoRuntimeTable checks the releases at hand against it).
var goOffsets = map[string][3]uint32{
	"go1.21": {48, 192, 344},
	"go1.22": {48, 192, 344},
	"go1.23": {48, 192, 352},
	"go1.24": {48, 192, 352},
	"go1.25": {48, 184, 344},
	"go1.26": {48, 184, 352},
}

// oldestGo is the oldest release whose offsets sonde knows: older programs go without labels.
const oldestGo = "go1.21"

// ErrNotGo: the file is not a Go program.
var ErrNotGo = errors.New("not a Go program")

// ReadGoRuntime finds, in a Go program's file, where its runtime keeps the running
// goroutine's labels: from its release's entry in a table, checked against DWARF by the
// tests, so that stripped binaries work too; from its DWARF for a release newer than
// the table; never from sonde's own Go.
func ReadGoRuntime(f *elf.File, r io.ReaderAt) (*GoRuntime, error) {
	info, err := buildinfo.Read(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotGo, err)
	}
	rt := &GoRuntime{Version: info.GoVersion}
	lang := version.Lang(strings.Fields(info.GoVersion + " ")[0])
	if lang == "" {
		// A development build: "devel go1.27-…" lays things out as the newest release does.
		if i := strings.Index(info.GoVersion, "go1."); i >= 0 {
			lang = version.Lang(strings.Fields(info.GoVersion[i:] + " ")[0])
		}
	}
	if lang == "" || version.Compare(lang, oldestGo) < 0 {
		return nil, fmt.Errorf("labels of Go release %q: %w", info.GoVersion, ErrUnsupported)
	}
	rt.SliceLabels = version.Compare(lang, "go1.24") >= 0
	if f.Machine != elf.EM_X86_64 {
		// arm64 keeps g in a register, which a sample of C code called from Go may not hold.
		return nil, fmt.Errorf("labels of Go on %v: %w", f.Machine, ErrUnsupported)
	}
	if rt.GOffset, err = goTLSOffset(f); err != nil {
		return nil, err
	}
	// The table first: f.DWARF decompresses every debug section of the binary, tens of
	// megabytes for a large Go program, to read three offsets that TestGoRuntimeTable
	// holds the table to.
	if off, ok := goOffsets[lang]; ok {
		rt.GM, rt.MCurg, rt.GLabels = off[0], off[1], off[2]
		return rt, nil
	}
	if d, err := f.DWARF(); err == nil {
		if off, ok := dwarfOffsets(d); ok {
			rt.GM, rt.MCurg, rt.GLabels, rt.FromDWARF = off[0], off[1], off[2], true
			return rt, nil
		}
	}
	return nil, fmt.Errorf("labels of Go release %q, newer than the table, without DWARF: offsets unknown: %w", info.GoVersion, ErrUnsupported)
}

// goTLSOffset finds where the runtime keeps g, from the thread pointer: runtime.tlsg's
// place in the TLS segment when the symbol table names it (a cgo program's TLS holds the C
// libraries' variables too), else -8, the slot of a program the Go linker linked alone,
// whose TLS segment is that one pointer.
func goTLSOffset(f *elf.File) (int32, error) {
	// A TLS segment of one pointer or none needs no look at the symbol table, whose
	// scan by name is the costliest part of inspecting a large Go program.
	alone := true
	for _, p := range f.Progs {
		if p.Type == elf.PT_TLS && p.Memsz > 8 {
			alone = false
		}
	}
	if alone {
		return -8, nil
	}
	if value, info, ok := objfile.LookupSymbol(f, "runtime.tlsg"); ok && elf.ST_TYPE(info) == elf.STT_TLS {
		off, err := staticOffset(f, value)
		if err != nil {
			return 0, err
		}
		return int32(off), nil
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_TLS && p.Memsz > 8 {
			return 0, fmt.Errorf("stripped Go program with %d bytes of TLS: where g is is unknown: %w", p.Memsz, ErrUnsupported)
		}
	}
	return -8, nil
}

// maxDWARFEntries bounds the walk over a program's DWARF: the runtime's types come early,
// and a corrupt file must not be walked forever.
const maxDWARFEntries = 4 << 20

// dwarfOffsets reads g.m, m.curg and g.labels from runtime.g's and runtime.m's DWARF.
func dwarfOffsets(d *dwarf.Data) (off [3]uint32, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	want := map[string]map[string]int{"runtime.g": {"m": 0, "labels": 2}, "runtime.m": {"curg": 1}}
	found := 0
	rd := d.Reader()
	for n := 0; n < maxDWARFEntries && found < 3; n++ {
		e, err := rd.Next()
		if err != nil || e == nil {
			break
		}
		if e.Tag != dwarf.TagStructType {
			continue
		}
		name, _ := e.Val(dwarf.AttrName).(string)
		fields, ok := want[name]
		if !ok || !e.Children {
			continue
		}
		delete(want, name)
		for {
			c, err := rd.Next()
			if err != nil || c == nil || c.Tag == 0 {
				break
			}
			if c.Tag != dwarf.TagMember {
				rd.SkipChildren()
				continue
			}
			member, _ := c.Val(dwarf.AttrName).(string)
			loc, isInt := c.Val(dwarf.AttrDataMemberLoc).(int64)
			if i, ok := fields[member]; ok && isInt && loc >= 0 && loc < 1<<16 {
				off[i] = uint32(loc)
				found++
			}
		}
	}
	return off, found == 3
}
