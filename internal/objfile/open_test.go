package objfile

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"golang.org/x/sys/unix"
)

func keyOf(t *testing.T, path string) Key {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return Key{Dev: st.Dev, Inode: st.Ino}
}

// fakeRoot lays out dir/proc/1/root as a symlink to dir/rootfs, as /proc/PID/root is a
// link to the process's root, and returns the proc dir and the root file system.
func fakeRoot(t *testing.T) (procDir, rootfs string) {
	t.Helper()
	dir := t.TempDir()
	procDir = filepath.Join(dir, "proc", "1")
	rootfs = filepath.Join(dir, "rootfs")
	for _, d := range []string{procDir, filepath.Join(rootfs, "lib")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(rootfs, filepath.Join(procDir, "root")); err != nil {
		t.Fatal(err)
	}
	return procDir, rootfs
}

// Whatever sits at a mapped path (a FIFO no one writes, a device, a socket, a directory)
// is refused at once: opening never blocks and reads nothing.
func TestOpenRefusesWhatIsNotAFile(t *testing.T) {
	procDir, rootfs := fakeRoot(t)
	fifo := filepath.Join(rootfs, "lib", "fifo.so")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(rootfs, "lib", "sock.so")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dirPath := filepath.Join(rootfs, "lib", "dir.so")
	os.Mkdir(dirPath, 0o755)
	for _, tc := range []struct{ name, path string }{
		{"fifo", "/lib/fifo.so"},
		{"socket", "/lib/sock.so"},
		{"directory", "/lib/dir.so"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFile(Key{}, tc.path, Source{ProcDir: procDir, Path: tc.path})
			done := make(chan error, 1)
			go func() {
				h, err := f.Open()
				if h != nil {
					h.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, ErrNotRegular) {
					t.Errorf("open %s: %v, want ErrNotRegular", tc.name, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("open of a %s blocked", tc.name)
			}
		})
	}
	t.Run("device", func(t *testing.T) {
		if _, err := OpenHost("/dev/null"); !errors.Is(err, ErrNotRegular) {
			t.Errorf("open /dev/null: %v, want ErrNotRegular", err)
		}
	})
}

// A symlink a container controls resolves inside the container's root, never on the host.
func TestOpenStaysInsideTheRoot(t *testing.T) {
	procDir, rootfs := fakeRoot(t)
	secret := filepath.Join(t.TempDir(), "host-secret")
	os.WriteFile(secret, []byte("host"), 0o644)
	for _, target := range []string{secret, "../../../../../../../../" + secret} {
		link := filepath.Join(rootfs, "lib", "evil.so")
		os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		f := NewFile(Key{}, "/lib/evil.so", Source{ProcDir: procDir, Path: "/lib/evil.so"})
		if h, err := f.Open(); err == nil {
			buf := make([]byte, 4)
			n, _ := h.ReadAt(buf, 0)
			h.Close()
			t.Errorf("symlink to %s opened, read %q: it must resolve inside the container's root", target, buf[:n])
		}
	}
	// The same name inside the root is what the link reaches.
	inside := filepath.Join(rootfs, secret)
	os.MkdirAll(filepath.Dir(inside), 0o755)
	os.WriteFile(inside, []byte("ctr!"), 0o644)
	link := filepath.Join(rootfs, "lib", "evil.so")
	os.Remove(link)
	os.Symlink(secret, link)
	h, err := NewFile(Key{}, "/lib/evil.so", Source{ProcDir: procDir, Path: "/lib/evil.so"}).Open()
	if err != nil {
		t.Fatalf("in-root symlink: %v", err)
	}
	defer h.Close()
	buf := make([]byte, 4)
	if n, _ := h.ReadAt(buf, 0); string(buf[:n]) != "ctr!" {
		t.Errorf("read %q through the in-root symlink, want the container's file", buf[:n])
	}
}

// A path that now names another file than the one mapped is not read as if it were it.
func TestOpenChecksTheInode(t *testing.T) {
	procDir, rootfs := fakeRoot(t)
	lib := filepath.Join(rootfs, "lib", "libx.so")
	os.WriteFile(lib, []byte("old"), 0o644)
	key := keyOf(t, lib)
	os.Remove(lib)
	os.WriteFile(lib, []byte("new!"), 0o644)
	if keyOf(t, lib) == key {
		t.Skip("the file system reused the inode")
	}
	_, err := NewFile(key, "/lib/libx.so", Source{ProcDir: procDir, Path: "/lib/libx.so"}).Open()
	if !errors.Is(err, ErrReplaced) {
		t.Errorf("replaced file: %v, want ErrReplaced", err)
	}
}

// Reads stop at the size the file had when opened, whether it grows or shrinks after.
func TestReadsStayWithinTheOpenedSize(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	os.WriteFile(p, make([]byte, 100), 0o644)
	h, err := OpenHost(p)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	w, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	w.Write(make([]byte, 1000))
	w.Close()
	buf := make([]byte, 2000)
	if n, err := h.ReadAt(buf, 0); n != 100 || err == nil {
		t.Errorf("grown file: read %d bytes (%v), want the 100 it had", n, err)
	}
	os.Truncate(p, 10)
	if n, err := h.ReadAt(buf[:50], 0); n != 10 || err == nil {
		t.Errorf("shrunk file: read %d bytes (%v), want 10 and an error", n, err)
	}
}

func TestOpenRefusesHugeFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sparse")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(10 << 30); err != nil {
		f.Close()
		testenv.Unavailable(t, "no sparse files here: %v", err)
	}
	f.Close()
	if _, err := OpenHost(p); !errors.Is(err, ErrTooLarge) {
		t.Errorf("10 GB sparse file: %v, want ErrTooLarge", err)
	}
}

// A deleted file stays reachable through map_files as long as a process maps it, and a
// process sharing sonde's root leaves the host path as a way back.
func TestOpenThroughMapFiles(t *testing.T) {
	testenv.RequireRoot(t)
	p := filepath.Join(t.TempDir(), "mapped")
	os.WriteFile(p, make([]byte, 8192), 0o644)
	key := keyOf(t, p)
	fd, err := unix.Open(p, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, 8192, unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	os.Remove(p)
	start := uint64(uintptr(unsafePointer(mem)))
	src := Source{ProcDir: "/proc/" + itoa(os.Getpid()), Start: start, End: start + 8192, Path: p, HostRoot: true}
	h, err := NewFile(key, p, src).Open()
	if err != nil {
		t.Fatalf("deleted but mapped file: %v", err)
	}
	if h.Size() != 8192 {
		t.Errorf("size %d", h.Size())
	}
	h.Close()
}

// An open that never returns is abandoned after OpenTimeout, and the device it was on is
// not tried again: whatever a file system does, sonde's stages move on.
func TestStalledOpenIsAbandoned(t *testing.T) {
	defer func(d time.Duration) { OpenTimeout = d }(OpenTimeout)
	OpenTimeout = 50 * time.Millisecond
	block := make(chan struct{})
	defer close(block)
	const dev = 0xdead
	_, err := bounded(dev, func() (*Handle, error) { <-block; return nil, errors.New("late") })
	if !errors.Is(err, ErrStalled) {
		t.Fatalf("blocked open: %v, want ErrStalled", err)
	}
	start := time.Now()
	_, err = bounded(dev, func() (*Handle, error) { t.Error("a stalled device was tried again"); return nil, nil })
	if !errors.Is(err, ErrStalled) || time.Since(start) > 10*time.Millisecond {
		t.Errorf("second open on the stalled device: %v after %v, want ErrStalled at once", err, time.Since(start))
	}
}
