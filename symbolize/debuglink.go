package symbolize

import (
	"bytes"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// DefaultDebugDirs are where distributions install separate debug files: Debian's
// -dbgsym and -dbg packages put them under .build-id/xx/yyyy.debug there.
var DefaultDebugDirs = []string{"/usr/lib/debug"}

// debugFile is a separate debug file found for an object file.
type debugFile struct {
	path string
	file *os.File
	elf  *elf.File
}

func (d *debugFile) Close() error { return d.file.Close() }

// findDebugFile looks for the separate debug information of f: first by build ID
// in each debug directory, which identifies the file exactly, then by the name and
// CRC in .gnu_debuglink, next to the file (as opened, so through a container's root),
// in its .debug directory and in each debug directory under the file's own path, as
// gdb does. It returns nil when there is none; the error says why a candidate that
// exists could not be used.
func findDebugFile(f *elf.File, buildID, openedPath, path string, dirs []string) (*debugFile, error) {
	if buildID == "" {
		buildID = gnuBuildID(f)
	}
	var errs []error
	if len(buildID) > 2 {
		for _, dir := range dirs {
			p := filepath.Join(dir, ".build-id", buildID[:2], buildID[2:]+".debug")
			d, err := openDebugFile(p, func(df *elf.File, _ *os.File) error {
				if got := gnuBuildID(df); got != buildID {
					return fmt.Errorf("build id %q, want %q", got, buildID)
				}
				return nil
			})
			if d != nil {
				return d, nil
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	name, crc, ok := debugLink(f)
	if !ok {
		return nil, errors.Join(errs...)
	}
	openedDir, fileDir := filepath.Dir(openedPath), filepath.Dir(path)
	candidates := []string{filepath.Join(openedDir, name), filepath.Join(openedDir, ".debug", name)}
	for _, dir := range dirs {
		candidates = append(candidates, filepath.Join(dir, fileDir, name))
	}
	for _, p := range candidates {
		if p == openedPath {
			continue
		}
		d, err := openDebugFile(p, func(_ *elf.File, r *os.File) error {
			h := crc32.NewIEEE()
			if _, err := io.Copy(h, io.NewSectionReader(r, 0, 1<<62)); err != nil {
				return err
			}
			if got := h.Sum32(); got != crc {
				return fmt.Errorf("crc %#08x, want %#08x from .gnu_debuglink", got, crc)
			}
			return nil
		})
		if d != nil {
			return d, nil
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return nil, errors.Join(errs...)
}

// openDebugFile opens p if it exists and check accepts it.
func openDebugFile(p string, check func(*elf.File, *os.File) error) (*debugFile, error) {
	r, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ef, err := openELF(r)
	if err == nil {
		err = check(ef, r)
	}
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("debug file %s: %w", p, err)
	}
	return &debugFile{path: p, file: r, elf: ef}, nil
}

// ntGNUBuildID is the note type of a GNU build ID, under owner "GNU".
const ntGNUBuildID = 3

// gnuBuildID returns the hex GNU build ID from the notes of f, or "".
func gnuBuildID(f *elf.File) (id string) {
	defer func() {
		if recover() != nil {
			id = ""
		}
	}()
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOTE {
			continue
		}
		data, err := s.Data()
		if err != nil {
			continue
		}
		for len(data) >= 12 {
			namesz, descsz, typ := f.ByteOrder.Uint32(data), f.ByteOrder.Uint32(data[4:]), f.ByteOrder.Uint32(data[8:])
			data = data[12:]
			nameEnd := (uint64(namesz) + 3) &^ 3
			descEnd := nameEnd + (uint64(descsz)+3)&^3
			if descEnd > uint64(len(data)) {
				break
			}
			if typ == ntGNUBuildID && string(bytes.TrimRight(data[:namesz], "\x00")) == "GNU" {
				return hex.EncodeToString(data[nameEnd : nameEnd+uint64(descsz)])
			}
			data = data[descEnd:]
		}
	}
	return ""
}

// debugLink returns the file name and CRC32 in .gnu_debuglink.
func debugLink(f *elf.File) (name string, crc uint32, ok bool) {
	s := f.Section(".gnu_debuglink")
	if s == nil || s.Type == elf.SHT_NOBITS || s.Size > 4096 {
		return "", 0, false
	}
	data, err := s.Data()
	if err != nil {
		return "", 0, false
	}
	// The name, NUL-terminated, padded to 4 bytes, then the CRC.
	i := bytes.IndexByte(data, 0)
	if i <= 0 {
		return "", 0, false
	}
	name = string(data[:i])
	off := (i + 4) &^ 3
	if off+4 > len(data) || strings.ContainsRune(name, '/') {
		return "", 0, false
	}
	return name, f.ByteOrder.Uint32(data[off:]), true
}
