package trace

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

// fileIdentity is what sonde learns from an ELF file once, at first sight.
type fileIdentity struct {
	GNUBuildID, GoBuildID, HTLHash string
	IsGo                           bool
}

// readIdentity reads build IDs from the notes and hashes files that have none.
func readIdentity(r io.ReaderAt, size int64) (fileIdentity, error) {
	var id fileIdentity
	f, err := safeNewELF(r)
	if err != nil {
		return id, err
	}
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOTE {
			continue
		}
		data, err := s.Data()
		if err != nil {
			return id, fmt.Errorf("read note section %s: %w", s.Name, err)
		}
		gnu, goID := parseNotes(data, f.ByteOrder)
		id.GNUBuildID = cmpOr(id.GNUBuildID, gnu)
		id.GoBuildID = cmpOr(id.GoBuildID, goID)
	}
	if len(f.Sections) == 0 {
		// Section headers can be stripped; the loader still needs the PT_NOTE segments.
		for _, p := range f.Progs {
			if p.Type != elf.PT_NOTE {
				continue
			}
			data := make([]byte, p.Filesz)
			if _, err := p.ReadAt(data, 0); err != nil {
				return id, fmt.Errorf("read note segment: %w", err)
			}
			gnu, goID := parseNotes(data, f.ByteOrder)
			id.GNUBuildID = cmpOr(id.GNUBuildID, gnu)
			id.GoBuildID = cmpOr(id.GoBuildID, goID)
		}
	}
	id.IsGo = id.GoBuildID != "" || f.Section(".gopclntab") != nil || f.Section(".go.buildinfo") != nil
	if id.GNUBuildID == "" && id.GoBuildID == "" {
		if id.HTLHash, err = htlHash(r, size); err != nil {
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

// safeNewELF parses ELF headers; debug/elf can panic on hostile input, which must not take sonde down.
func safeNewELF(r io.ReaderAt) (f *elf.File, err error) {
	defer func() {
		if p := recover(); p != nil {
			f, err = nil, fmt.Errorf("malformed elf: %v", p)
		}
	}()
	f, err = elf.NewFile(r)
	if err != nil {
		return nil, fmt.Errorf("parse elf: %w", err)
	}
	return f, nil
}

// parseNotes walks ELF notes and returns the GNU build ID (hex) and the Go build ID.
func parseNotes(data []byte, order binary.ByteOrder) (gnu, goID string) {
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
		case name == "GNU" && typ == noteGNUBuildID:
			gnu = hex.EncodeToString(desc)
		case name == "Go" && typ == noteGoBuildID:
			goID = string(desc)
		}
		data = data[descEnd:]
	}
	return
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }

// ParseKernelNotes reads the kernel's own build ID from /sys/kernel/notes.
func ParseKernelNotes(data []byte) (string, error) {
	gnu, _ := parseNotes(data, binary.NativeEndian)
	if gnu == "" {
		return "", errors.New("no gnu build id note")
	}
	return gnu, nil
}

// htlHash identifies a file by its first and last 4 KiB and its length, the way the
// OpenTelemetry eBPF profiler names files without build IDs: cheap and stable across hosts.
func htlHash(r io.ReaderAt, size int64) (string, error) {
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
