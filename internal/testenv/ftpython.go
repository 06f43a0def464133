package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// No Debian or Ubuntu package holds a free-threaded CPython (python3.14t), so the tests
// build one as python.org's and the container images' do: Ubuntu's source of the 3.14 in
// 26.04 LTS, configured with --disable-gil, run from its build directory.
const (
	ftPythonTarball = "python3.14_3.14.4.orig.tar.xz"
	ftPythonPool    = ubuntuMirror + "/pool/main/p/python3.14/"
	// The tarball's SHA-256, as the suite's Sources index gives it.
	ftPythonSHA256 = "d923c51303e38e249136fc1bdf3568d56ecb03214efdef48516176d3d7faaef8"
)

// FreeThreadedPython is CPython 3.14 built without the GIL (BuildFreeThreadedPython),
// run on the host.
func FreeThreadedPython(t testing.TB) Python {
	t.Helper()
	path := builtFromSource(t, "a free-threaded CPython", BuildFreeThreadedPython)
	b, err := exec.Command(path, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])").Output()
	if err != nil {
		Unavailable(t, "%s: %v", path, err)
	}
	v := strings.TrimSpace(string(b))
	return Python{Name: v + "t (free-threaded)", Version: v, Path: path, Lib: path}
}

// BuildFreeThreadedPython builds the interpreter FreeThreadedPython runs, if no complete
// one is cached, and returns its path. logf hears what it does.
func BuildFreeThreadedPython(logf func(format string, args ...any)) (string, error) {
	dir := filepath.Join(cacheDir("SONDE_FTPYTHON_CACHE", "/var/tmp/sonde-ftpython"), strings.TrimSuffix(ftPythonTarball, ".orig.tar.xz"))
	return filepath.Join(dir, "python"), buildCached(dir, logf, func(tmp string) error {
		tarball, err := httpGet(ftPythonPool + ftPythonTarball)
		if err != nil {
			return err
		}
		if err := checkSHA256(tarball, ftPythonSHA256, ftPythonTarball); err != nil {
			return err
		}
		logf("building a free-threaded CPython from %s (%d bytes)", ftPythonTarball, len(tarball))
		if err := buildSource(tmp, tarball, nil,
			[]string{"./configure", "--disable-gil", "--without-ensurepip", "--disable-test-modules"},
			// The interpreter and the extension modules beside it (zlib).
			[]string{"make", "-j2", "python", "sharedmods"},
			// As an installation would: a workload importing the standard library (asyncio)
			// would otherwise compile it in its first seconds. (An import gives the code
			// objects the file name they are loaded from, not the build directory's.)
			[]string{"./python", "-m", "compileall", "-q", "-j", "0", "-x", "/(test|idlelib|tkinter|turtledemo)/", "Lib"},
		); err != nil {
			return err
		}
		if out, err := exec.Command(filepath.Join(tmp, "python"), "-c", "import sys, zlib; sys.exit(sys._is_gil_enabled())").CombinedOutput(); err != nil {
			return fmt.Errorf("the CPython built runs with the GIL or without zlib: %v\n%s", err, out)
		}
		// The objects are half a gigabyte and the tests need none of them.
		return filepath.WalkDir(tmp, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".o") {
				os.Remove(p)
			}
			return nil
		})
	})
}
