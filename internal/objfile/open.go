package objfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// MaxSize bounds the files sonde reads. The largest real executables and libraries
// (browsers, LLVM, binaries with debug info) stay below it; a 10 GB sparse file a process
// maps is skipped rather than hashed or parsed.
const MaxSize = 4 << 30

// fuseMagic is FUSE_SUPER_MAGIC: files whose reads a user-space daemon answers, or never.
const fuseMagic = 0x65735546

// Reasons a file is refused, for callers that count them.
var (
	ErrNotRegular = errors.New("not a regular file")
	ErrTooLarge   = errors.New("file too large")
	ErrReplaced   = errors.New("path reaches another file than the one mapped")
	ErrFUSE       = errors.New("file on a FUSE file system, whose reads may never return")
)

// Key identifies a file on the host: the device and inode /proc/PID/maps reports.
type Key struct {
	Dev, Inode uint64
}

// Handle is an open object file, readable within the size it had when opened.
type Handle struct {
	f    *os.File
	size int64
	root *root // the root it was reached through; nil for host paths
	name string
}

// Name is the path the handle was opened by, for messages.
func (h *Handle) Name() string { return h.name }

// Fd is the open file's descriptor, for mapping it: valid until Close, and the file
// behind it was checked to be regular and no larger than the bound when opened.
func (h *Handle) Fd() int { return int(h.f.Fd()) }

// Size is the file's size when it was opened; reads stop there.
func (h *Handle) Size() int64 { return h.size }

// ReadAt reads within the size the file had when opened: a file that grows is read as it
// was, one that shrinks ends early.
func (h *Handle) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= h.size {
		return 0, io.EOF
	}
	if rest := h.size - off; int64(len(p)) > rest {
		n, err := h.f.ReadAt(p[:rest], off)
		if err == nil {
			err = io.EOF
		}
		return n, err
	}
	return h.f.ReadAt(p, off)
}

// File is the open descriptor, for callers that map the file into memory.
func (h *Handle) File() *os.File { return h.f }

// Close closes the file.
func (h *Handle) Close() error { return h.f.Close() }

// OpenSibling opens path as the file's own process sees it: inside the same root, so a
// debug link next to a container's library is the container's file. A handle opened by a
// host path opens host paths.
func (h *Handle) OpenSibling(path string) (*Handle, error) {
	if h.root == nil {
		return OpenHost(path)
	}
	return bounded(0, func() (*Handle, error) { return h.root.open(path, Key{}) })
}

// OpenHost opens a host path that sonde chose itself (debug directories), with the same
// checks as mapped files: no blocking, regular files only, within MaxSize.
func OpenHost(path string) (*Handle, error) {
	return bounded(0, func() (*Handle, error) {
		fd, err := openPath(path)
		if err != nil {
			return nil, err
		}
		return reopen(fd, path, Key{}, nil)
	})
}

// reopen turns a descriptor opened with O_PATH, which nothing at the path could block or
// act on, into a readable one, once fstat shows a regular file that is want (when want is
// set). It closes pathFD.
func reopen(pathFD int, name string, want Key, r *root) (*Handle, error) {
	defer unix.Close(pathFD)
	var st unix.Stat_t
	if err := unix.Fstat(pathFD, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: name, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("open %s: %w (mode %#o)", name, ErrNotRegular, st.Mode&unix.S_IFMT)
	}
	if want != (Key{}) && (st.Ino != want.Inode || st.Dev != want.Dev) {
		return nil, fmt.Errorf("open %s: %w (inode %d on %#x, mapped %d on %#x)", name, ErrReplaced, st.Ino, st.Dev, want.Inode, want.Dev)
	}
	if st.Size > MaxSize {
		return nil, fmt.Errorf("open %s: %w: %d bytes, over %d", name, ErrTooLarge, st.Size, int64(MaxSize))
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(pathFD, &sfs); err == nil && uint32(sfs.Type) == fuseMagic {
		return nil, fmt.Errorf("open %s: %w", name, ErrFUSE)
	}
	// Through the descriptor, not the path: the path may name something else by now.
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pathFD), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return &Handle{f: os.NewFile(uintptr(fd), name), size: st.Size, root: r, name: name}, nil
}

// root is a process's root directory, in which its paths resolve.
type root struct {
	dir string // /proc/PID/root
}

// open resolves path inside the root: symlinks, absolute or with "..", cannot leave it.
func (r *root) open(path string, want Key) (*Handle, error) {
	name := filepath.Join(r.dir, path)
	dirFD, err := unix.Open(r.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: r.dir, Err: err}
	}
	defer unix.Close(dirFD)
	fd, err := unix.Openat2(dirFD, path, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return reopen(fd, name, want, r)
}

// openPath opens a path as O_PATH: nothing there can block the open or act on it.
func openPath(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// openMapFile opens a /proc/PID/map_files link: the very file mapped, also when its path
// was deleted or replaced, or never had one.
func openMapFile(name string, want Key, r *root) (*Handle, error) {
	fd, err := openPath(name)
	if err != nil {
		return nil, err
	}
	return reopen(fd, name, want, r)
}
