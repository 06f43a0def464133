package objfile

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
)

// ELF note types sonde reads.
const (
	noteGNUBuildID = 3 // NT_GNU_BUILD_ID, owner "GNU"
	noteGoBuildID  = 4 // owner "Go"
)

// maxNotesSize bounds the notes read from one file: build IDs take tens of bytes, and
// real note sections stay under a few kilobytes.
const maxNotesSize = 1 << 20

// Identity is what sonde learns from an ELF file once, at first sight.
type Identity struct {
	GNUBuildID, GoBuildID, HTLHash string
	IsGo                           bool
}

// Identify reads the file's identity into f. Call it before the file is shared.
func Identify(f *File) error {
	h, err := f.Open()
	if err != nil {
		return err
	}
	defer h.Close()
	id, err := ReadIdentity(h, h.Size())
	if err != nil {
		return fmt.Errorf("identify %s: %w", f.Path, err)
	}
	f.GNUBuildID, f.GoBuildID, f.HTLHash, f.IsGo = id.GNUBuildID, id.GoBuildID, id.HTLHash, id.IsGo
	return nil
}

// ReadIdentity reads build IDs from the notes of the ELF file in r, of size bytes, and
// hashes files that have none.
func ReadIdentity(r io.ReaderAt, size int64) (Identity, error) {
	var id Identity
	f, err := NewELF(r)
	if err != nil {
		return id, err
	}
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOTE {
			continue
		}
		data, err := SectionData(s, maxNotesSize)
		if err != nil {
			return id, fmt.Errorf("read note section: %w", err)
		}
		gnu, goID := ParseNotes(data, f.ByteOrder)
		id.GNUBuildID = cmpOr(id.GNUBuildID, gnu)
		id.GoBuildID = cmpOr(id.GoBuildID, goID)
	}
	if len(f.Sections) == 0 {
		// Section headers can be stripped; the loader still needs the PT_NOTE segments.
		for _, p := range f.Progs {
			if p.Type != elf.PT_NOTE {
				continue
			}
			if p.Filesz > maxNotesSize {
				return id, fmt.Errorf("read note segment: %d bytes, over the bound of %d", p.Filesz, maxNotesSize)
			}
			data, err := ProgData(p, 0, p.Filesz)
			if err != nil {
				return id, fmt.Errorf("read note segment: %w", err)
			}
			gnu, goID := ParseNotes(data, f.ByteOrder)
			id.GNUBuildID = cmpOr(id.GNUBuildID, gnu)
			id.GoBuildID = cmpOr(id.GoBuildID, goID)
		}
	}
	id.IsGo = id.GoBuildID != "" || f.Section(".gopclntab") != nil || f.Section(".go.buildinfo") != nil
	if id.GNUBuildID == "" && id.GoBuildID == "" {
		if id.HTLHash, err = HTLHash(r, size); err != nil {
			return id, err
		}
	}
	return id, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// ParseNotes walks ELF notes and returns the GNU build ID (hex) and the Go build ID.
// Truncated or oversized entries end the walk; nothing in data is trusted.
func ParseNotes(data []byte, order binary.ByteOrder) (gnu, goID string) {
	for len(data) >= 12 {
		namesz := order.Uint32(data[0:])
		descsz := order.Uint32(data[4:])
		typ := order.Uint32(data[8:])
		data = data[12:]
		nameEnd := align4(uint64(namesz))
		descEnd := nameEnd + align4(uint64(descsz))
		if nameEnd > uint64(len(data)) || descEnd > uint64(len(data)) {
			return
		}
		name := string(bytes.TrimRight(data[:namesz], "\x00"))
		desc := data[nameEnd : nameEnd+uint64(descsz)]
		switch {
		case name == "GNU" && typ == noteGNUBuildID && gnu == "":
			gnu = hex.EncodeToString(desc)
		case name == "Go" && typ == noteGoBuildID && goID == "":
			goID = string(desc)
		}
		data = data[descEnd:]
	}
	return
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }

// ParseKernelNotes reads the kernel's own build ID from /sys/kernel/notes.
func ParseKernelNotes(data []byte) (string, error) {
	gnu, _ := ParseNotes(data, binary.NativeEndian)
	if gnu == "" {
		return "", errors.New("no gnu build id note")
	}
	return gnu, nil
}

// HTLHash identifies a file by its first and last 4 KiB and its length, the way the
// OpenTelemetry eBPF profiler names files without build IDs: cheap and stable across
// hosts.
func HTLHash(r io.ReaderAt, size int64) (string, error) {
	const chunk = 4096
	h := sha256.New()
	buf := make([]byte, chunk)
	n, err := r.ReadAt(buf[:min(chunk, size)], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("hash head: %w", err)
	}
	h.Write(buf[:n])
	tailAt := max(size-chunk, 0)
	n, err = r.ReadAt(buf[:size-tailAt], tailAt)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("hash tail: %w", err)
	}
	h.Write(buf[:n])
	var lenBuf [8]byte
	binary.BigEndian.PutUint64(lenBuf[:], uint64(size))
	h.Write(lenBuf[:])
	return hex.EncodeToString(h.Sum(nil)[:16]), nil
}

// GNUBuildID returns the hex GNU build ID from the note sections of f, or "".
func GNUBuildID(f *elf.File) string {
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOTE {
			continue
		}
		data, err := SectionData(s, maxNotesSize)
		if err != nil {
			continue
		}
		if gnu, _ := ParseNotes(data, f.ByteOrder); gnu != "" {
			return gnu
		}
	}
	return ""
}
