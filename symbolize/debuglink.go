package symbolize

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// DefaultDebugDirs are where distributions install separate debug files: Debian's
// -dbgsym and -dbg packages put them under .build-id/xx/yyyy.debug there.
var DefaultDebugDirs = []string{"/usr/lib/debug"}

// debugFile is a separate debug file found for an object file.
type debugFile struct {
	path string
	file *objfile.Handle
	elf  *elf.File
}

func (d *debugFile) Close() error { return d.file.Close() }

// findDebugFile looks for the separate debug information of f, opened as h: first by
// build ID in each debug directory, which identifies the file exactly, then by the name
// and CRC in .gnu_debuglink, next to the file (inside the root of the process mapping
// it, so a container's debug link finds the container's file), in its .debug directory
// and in each debug directory under the file's own path, as gdb does. It returns nil
// when there is none; the error says why a candidate that exists could not be used.
func findDebugFile(f *elf.File, h *objfile.Handle, buildID, path string, dirs []string) (*debugFile, error) {
	if buildID == "" {
		buildID = objfile.GNUBuildID(f)
	}
	var errs []error
	if len(buildID) > 2 {
		for _, dir := range dirs {
			p := filepath.Join(dir, ".build-id", buildID[:2], buildID[2:]+".debug")
			d, err := openDebugFile(p, objfile.OpenHost, func(df *elf.File, _ *objfile.Handle) error {
				if got := objfile.GNUBuildID(df); got != buildID {
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
	fileDir := filepath.Dir(path)
	type candidate struct {
		path string
		open func(string) (*objfile.Handle, error)
	}
	candidates := []candidate{
		{filepath.Join(fileDir, name), h.OpenSibling},
		{filepath.Join(fileDir, ".debug", name), h.OpenSibling},
	}
	for _, dir := range dirs {
		candidates = append(candidates, candidate{filepath.Join(dir, fileDir, name), objfile.OpenHost})
	}
	for _, c := range candidates {
		if c.path == path {
			continue
		}
		d, err := openDebugFile(c.path, c.open, func(_ *elf.File, r *objfile.Handle) error {
			h := crc32.NewIEEE()
			if _, err := io.Copy(h, io.NewSectionReader(r, 0, r.Size())); err != nil {
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
func openDebugFile(p string, open func(string) (*objfile.Handle, error), check func(*elf.File, *objfile.Handle) error) (*debugFile, error) {
	r, err := open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ef, err := r.ELF()
	if err == nil {
		err = check(ef, r)
	}
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("debug file %s: %w", p, err)
	}
	return &debugFile{path: p, file: r, elf: ef}, nil
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
