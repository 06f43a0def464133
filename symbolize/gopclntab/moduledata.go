package gopclntab

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// image reads a binary's loaded memory as the loader lays it out, from the file:
// from its bytes where the caller mapped it, else through debug/elf.
type image struct {
	f       *elf.File // nil once Load is done with it
	file    []byte    // the mapped file, or nil
	segs    []segment // the PT_LOAD segments, when file is set
	order   binary.ByteOrder
	ptrSize int
	// relative holds the addends of R_*_RELATIVE relocations by address, read on
	// first need: a position-independent binary linked externally may leave the
	// pointers of its moduledata zero in the file, to be filled in at load time.
	relative *objfile.Relocations
}

// segment is a PT_LOAD program header, as reading memory needs it.
type segment struct {
	vaddr, off, filesz uint64
}

func newImage(f *elf.File, file []byte) *image {
	m := &image{f: f, file: file, order: f.ByteOrder}
	if file == nil {
		return m
	}
	for _, p := range f.Progs {
		// Segments whose bytes the file does not hold are left out: reading them
		// would fault, or read past the mapping.
		if p.Type == elf.PT_LOAD && p.Off <= uint64(len(file)) && uint64(len(file))-p.Off >= p.Filesz {
			m.segs = append(m.segs, segment{vaddr: p.Vaddr, off: p.Off, filesz: p.Filesz})
		}
	}
	return m
}

func (m *image) mapped() bool { return m.file != nil }

// read returns n bytes at vaddr, or false when no segment holds them in the file.
// From a mapped file the bytes are not copied.
func (m *image) read(vaddr uint64, n int32) ([]byte, bool) {
	if n < 0 {
		return nil, false
	}
	if m.file != nil {
		for _, p := range m.segs {
			if vaddr < p.vaddr || vaddr-p.vaddr >= p.filesz {
				continue
			}
			if p.filesz-(vaddr-p.vaddr) < uint64(n) {
				return nil, false
			}
			off := p.off + (vaddr - p.vaddr)
			return m.file[off : off+uint64(n)], true
		}
		return nil, false
	}
	for _, p := range m.f.Progs {
		if p.Type != elf.PT_LOAD || vaddr < p.Vaddr || vaddr-p.Vaddr >= p.Filesz {
			continue
		}
		if p.Filesz-(vaddr-p.Vaddr) < uint64(n) {
			return nil, false
		}
		// A header may claim any size: the file must hold the last byte before a
		// buffer that large is made.
		if n > 0 {
			var last [1]byte
			if _, err := p.ReadAt(last[:], int64(vaddr-p.Vaddr)+int64(n)-1); err != nil {
				return nil, false
			}
		}
		b := make([]byte, n)
		if _, err := p.ReadAt(b, int64(vaddr-p.Vaddr)); err != nil {
			return nil, false
		}
		return b, true
	}
	return nil, false
}

// section returns the contents of s: in place in a mapped file when it is there
// uncompressed, else read.
func (m *image) section(s *elf.Section) ([]byte, error) {
	if m.file != nil && s.Flags&elf.SHF_COMPRESSED == 0 && s.Type != elf.SHT_NOBITS {
		if s.Offset > uint64(len(m.file)) || uint64(len(m.file))-s.Offset < s.FileSize {
			return nil, fmt.Errorf("section %s is past the end of the file", s.Name)
		}
		return m.file[s.Offset : s.Offset+s.FileSize], nil
	}
	return s.Data()
}

// words reads count pointer-sized words at vaddr, resolving relative relocations
// where the file holds zero.
func (m *image) words(vaddr uint64, count int) ([]uint64, bool) {
	b, ok := m.read(vaddr, int32(count*m.ptrSize))
	if !ok {
		return nil, false
	}
	w := make([]uint64, count)
	for i := range w {
		if m.ptrSize == 4 {
			w[i] = uint64(m.order.Uint32(b[4*i:]))
		} else {
			w[i] = m.order.Uint64(b[8*i:])
		}
		if w[i] == 0 {
			w[i] = m.relocated(vaddr + uint64(i*m.ptrSize))
		}
	}
	return w, true
}

func (m *image) relocated(vaddr uint64) uint64 {
	m.readRelocations()
	v, _ := m.relative.Word(vaddr)
	return v
}

// readRelocations reads the relocations once; after Load has let go of the file (m.f nil),
// there are none to read, and the words read as the file holds them.
func (m *image) readRelocations() {
	if m.relative != nil {
		return
	}
	if m.f == nil {
		m.relative = &objfile.Relocations{}
		return
	}
	m.relative = objfile.ReadRelocations(m.f, false)
}

// moduledata is what the runtime's moduledata tells that the pclntab does not.
type moduledata struct {
	text, gofunc uint64
}

// Word indexes into the runtime's moduledata: pcHeader, then six slices of three
// words (funcnametab, cutab, filetab, pctab, pclntable, ftab), findfunctab, minpc,
// maxpc, text, etext, and pairs for noptrdata, data, bss and noptrbss; Go 1.20
// added covctrs and ecovctrs before end, gcdata, gcbss, types, etypes, rodata and
// gofunc.
const (
	mdPCHeader    = 0
	mdFuncnametab = 1
	mdFtab        = 16
	mdMinPC       = 20
	mdText        = 22
	mdGofunc118   = 38
	mdGofunc120   = 40
)

// findModuledata locates the runtime's first moduledata, which points at the
// pclntab at addr: at the start of .go.module where Go 1.26 and later put it, else
// anywhere in the data sections.
func findModuledata(m *image, addr uint64, pclntab []byte, go120 bool) (moduledata, error) {
	if m.ptrSize != 4 && m.ptrSize != 8 {
		return moduledata{}, fmt.Errorf("pointer size %d", m.ptrSize)
	}
	gofuncIdx := mdGofunc118
	if go120 {
		gofuncIdx = mdGofunc120
	}
	hdrWord := func(i int) uint64 {
		off := 8 + i*m.ptrSize
		if m.ptrSize == 4 {
			return uint64(m.order.Uint32(pclntab[off:]))
		}
		return m.order.Uint64(pclntab[off:])
	}
	funcnameOff, pclnOff := hdrWord(3), hdrWord(7)
	check := func(at uint64) (moduledata, bool) {
		w, ok := m.words(at, gofuncIdx+1)
		if !ok {
			return moduledata{}, false
		}
		// Pointers the pclntab's own header predicts: a chance match of one word
		// must not pass for the moduledata.
		if w[mdPCHeader] != addr || w[mdFuncnametab] != addr+funcnameOff || w[mdFtab] != addr+pclnOff ||
			w[mdText] == 0 || w[mdMinPC] < w[mdText] || w[gofuncIdx] == 0 {
			return moduledata{}, false
		}
		return moduledata{text: w[mdText], gofunc: w[gofuncIdx]}, true
	}
	if s := m.f.Section(".go.module"); s != nil {
		if md, ok := check(s.Addr); ok {
			return md, nil
		}
	}
	var regions [][2]uint64
	for _, name := range []string{".noptrdata", ".data", ".data.rel.ro"} {
		if s := m.f.Section(name); s != nil && s.Type != elf.SHT_NOBITS {
			regions = append(regions, [2]uint64{s.Addr, s.Size})
		}
	}
	if len(m.f.Sections) == 0 {
		for _, p := range m.f.Progs {
			if p.Type == elf.PT_LOAD && p.Flags&elf.PF_W != 0 {
				regions = append(regions, [2]uint64{p.Vaddr, p.Filesz})
			}
		}
	}
	var found moduledata
	for _, r := range regions {
		if m.scan(r, addr, func(at uint64) bool {
			md, ok := check(at)
			found = md
			return ok
		}) {
			return found, nil
		}
	}
	// In a binary whose loader fills the pointers in, the relocation table says
	// where the pointer to the pclntab goes.
	m.readRelocations()
	found, ok := moduledata{}, false
	m.relative.Each(func(at, v uint64) bool {
		if v == addr {
			found, ok = check(at)
		}
		return !ok
	})
	if ok {
		return found, nil
	}
	return moduledata{}, errors.New("no moduledata points at the pclntab")
}

// scan calls try with every pointer-aligned address in region [start, start+size)
// holding the word v, until try accepts one.
func (m *image) scan(region [2]uint64, v uint64, try func(at uint64) bool) bool {
	const chunk = 1 << 20
	end := region[0] + region[1]
	for base := region[0]; base < end; base += chunk {
		b, ok := m.read(base, int32(min(chunk, end-base)))
		if !ok {
			return false
		}
		for off := 0; off+m.ptrSize <= len(b); off += m.ptrSize {
			var w uint64
			if m.ptrSize == 4 {
				w = uint64(m.order.Uint32(b[off:]))
			} else {
				w = m.order.Uint64(b[off:])
			}
			if w == v && try(base+uint64(off)) {
				return true
			}
		}
	}
	return false
}
