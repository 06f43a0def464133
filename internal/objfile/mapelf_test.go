package objfile

import (
	"bytes"
	"debug/elf"
	"os"
	"testing"
	"unsafe"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
)

// A file parsed over its mapping hands out uncompressed sections in place, the bytes the
// file holds, and compressed ones decompressed as ever.
func TestMapELFSectionsInPlace(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h, err := OpenHost(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	f, region, err := h.MapELF()
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	mapped := region.Bytes()
	within := func(b []byte) bool {
		p, lo := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(mapped)))
		return p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(mapped))
	}
	var inPlace, copied int
	err = mmapfile.Guard(func() {
		for _, s := range f.Sections {
			if s.Type == elf.SHT_NOBITS || s.Type == elf.SHT_NULL || s.Size == 0 {
				continue
			}
			got, err := SectionData(s, MaxSectionSize)
			if err != nil {
				t.Errorf("%s: %v", s.Name, err)
				continue
			}
			want, err := s.Data()
			if err != nil {
				t.Fatalf("%s: %v", s.Name, err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s: %d bytes read, not what debug/elf reads", s.Name, len(got))
			}
			compressed := s.Flags&elf.SHF_COMPRESSED != 0
			switch {
			case compressed && within(got):
				t.Errorf("%s: compressed, yet handed out in place", s.Name)
			case !compressed && !within(got):
				t.Errorf("%s: a copy, not the mapping", s.Name)
			case compressed:
				copied++
			default:
				inPlace++
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if f.Section(".gopclntab") == nil || inPlace == 0 {
		t.Fatalf("%d sections in place, %d decompressed: expected a Go test binary's sections", inPlace, copied)
	}
	t.Logf("%d sections in place, %d decompressed", inPlace, copied)
}
