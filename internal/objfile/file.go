package objfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// Source is one way to reach a mapped file: through a process that maps it, or by a host
// path sonde chose itself.
type Source struct {
	// ProcDir is the process's directory under proc, e.g. /proc/1234; empty for a host
	// path sonde chose, whose file is taken to be the one meant without a check of its key.
	ProcDir string
	// Start and End are the mapping's addresses, which name it under map_files.
	Start, End uint64
	// Path is the file's path as the process sees it.
	Path string
	// HostRoot says the process's root is sonde's: the path names the same file on the
	// host, and still reaches it after every process mapping it has exited.
	HostRoot bool
}

// maxSources bounds the processes a file remembers as ways to reach it.
const maxSources = 4

// File is an object file mapped by one or more processes. Its identity (build IDs, hash)
// is set once, before the file is shared; the ways to reach it change as processes come
// and go.
type File struct {
	Key  Key
	Path string // as the first process seen mapping it names it
	// GNUBuildID and GoBuildID come from the ELF notes, hex and as stored respectively.
	GNUBuildID string
	GoBuildID  string
	// HTLHash identifies files without a build ID: a hash of their head, tail and length.
	HTLHash string
	IsGo    bool

	mu       sync.Mutex
	sources  []Source // most recent first
	hostPath string   // a path on the host that reaches the file, once a mapper shared sonde's root
}

// HostFile describes a file sonde reaches by a host path of its own choosing, known by
// key in caches: a test's binary, say.
func HostFile(key Key, path string) *File {
	return NewFile(key, path, Source{Path: path})
}

// NewFile describes a file known by key, reachable through the given sources.
func NewFile(key Key, path string, sources ...Source) *File {
	f := &File{Key: key, Path: path}
	for _, s := range sources {
		f.AddSource(s)
	}
	return f
}

// AddSource records another process mapping the file.
func (f *File) AddSource(s Source) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s.HostRoot && f.hostPath == "" {
		f.hostPath = s.Path
	}
	for i, have := range f.sources {
		if have.ProcDir == s.ProcDir && have.Path == s.Path {
			f.sources[i] = s
			return
		}
	}
	if len(f.sources) == maxSources {
		f.sources = f.sources[:maxSources-1]
	}
	f.sources = append([]Source{s}, f.sources...)
}

// mapFilesDenied is set once opening through map_files was refused: it needs
// CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE, which a least-privilege deployment lacks, and
// a refusal then costs nothing further.
var mapFilesDenied atomic.Bool

// Open opens the file through the first way that still reaches the very inode mapped:
// a process's map_files entry, the path inside a process's root, or the host path. It
// gives up after OpenTimeout, and at once on a device where an open stalled before.
func (f *File) Open() (*Handle, error) {
	return bounded(f.Key.Dev, f.open)
}

func (f *File) open() (*Handle, error) {
	f.mu.Lock()
	sources := append([]Source(nil), f.sources...)
	hostPath := f.hostPath
	f.mu.Unlock()
	var errs []error
	for _, s := range sources {
		if s.ProcDir == "" {
			h, err := OpenHost(s.Path)
			if err == nil || refused(err) {
				return h, err
			}
			errs = append(errs, err)
			continue
		}
		if !mapFilesDenied.Load() {
			name := filepath.Join(s.ProcDir, "map_files", fmt.Sprintf("%x-%x", s.Start, s.End))
			h, err := openMapFile(name, f.Key, &root{dir: filepath.Join(s.ProcDir, "root")})
			if err == nil {
				return h, nil
			}
			if errors.Is(err, os.ErrPermission) {
				mapFilesDenied.Store(true)
			}
			if refused(err) {
				return nil, err
			}
			errs = append(errs, err)
		}
		h, err := (&root{dir: filepath.Join(s.ProcDir, "root")}).open(s.Path, f.Key)
		if err == nil || refused(err) {
			return h, err
		}
		errs = append(errs, err)
	}
	if hostPath != "" {
		fd, err := openPath(hostPath)
		if err == nil {
			return reopen(fd, hostPath, f.Key, nil)
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("open %s: no process maps it any more", f.Path)
	}
	return nil, fmt.Errorf("open %s: %w", f.Path, errors.Join(errs...))
}

// refused says the file was reached but is not one sonde reads: another way to it would
// find the same thing.
func refused(err error) bool {
	return errors.Is(err, ErrNotRegular) || errors.Is(err, ErrTooLarge) || errors.Is(err, ErrFUSE)
}

// IDKind says what an ID is made of.
type IDKind uint8

const (
	IDGNU   IDKind = iota + 1 // GNU build ID
	IDGo                      // Go build ID
	IDHTL                     // hash of head, tail and length
	IDInode                   // nothing better: device and inode
)

// ID names a file's contents: by build ID where there is one, so that copies in different
// containers share what is derived from them (unwind tables, symbols), else by hash or
// inode. IDs are comparable.
type ID struct {
	Kind  IDKind
	Value string
	Key   Key // for IDInode
}

// ID returns the file's identity.
func (f *File) ID() ID {
	switch {
	case f.GNUBuildID != "":
		return ID{Kind: IDGNU, Value: f.GNUBuildID}
	case f.GoBuildID != "":
		return ID{Kind: IDGo, Value: f.GoBuildID}
	case f.HTLHash != "":
		return ID{Kind: IDHTL, Value: f.HTLHash}
	default:
		return ID{Kind: IDInode, Key: f.Key}
	}
}

func (id ID) String() string {
	switch id.Kind {
	case IDGNU:
		return "gnu:" + id.Value
	case IDGo:
		return "go:" + id.Value
	case IDHTL:
		return "htl:" + id.Value
	default:
		return fmt.Sprintf("inode:%d:%d", id.Key.Dev, id.Key.Inode)
	}
}
