package testenv

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// Python is a CPython interpreter the tests can run.
type Python struct {
	Name    string // "3.11.7 (pyenv)"
	Version string // "3.11.7"
	Path    string // the program
	// Lib is the file holding the interpreter: Path's libpython, or Path itself when it
	// links the interpreter statically. It is a path on the host.
	Lib string
	// Root, where not empty, is the Debian root the interpreter runs in as a container's
	// (DebianPythons): Path is inside it.
	Root string
}

// Command runs the interpreter with args: on the host, or Contained in its root.
func (py Python) Command(args ...string) *exec.Cmd {
	if py.Root != "" {
		return Contained(py.Root, append([]string{py.Path}, args...)...)
	}
	return exec.Command(py.Path, args...)
}

// Script returns the path the interpreter runs a host file by: the file's own, or a copy
// in the interpreter's root, at /sonde-test/ and the file's name.
func (py Python) Script(t testing.TB, hostFile string) string {
	t.Helper()
	if py.Root == "" {
		return hostFile
	}
	return CopyInto(t, py.Root, hostFile, "/sonde-test/"+filepath.Base(hostFile))
}

// DebianPythons are Debian's own builds of the CPython versions services start on
// (statically linked, stripped, LTO and PGO, Debian's patch releases), in a Debian root
// (DebianRoot) and run in their own namespaces as a container runs them.
func DebianPythons(t testing.TB) []Python {
	t.Helper()
	return rootPythons(t, "/usr/bin/", "debian", "python3.13", "python3.14", "python3.15")
}

// UbuntuPythons are Ubuntu's own builds of CPython 3.13 (25.10) and 3.14 (26.04 LTS):
// stripped, statically linked, built by GCC 15, Ubuntu's patch releases; unpacked into the
// Debian root (UbuntuRoot) and run there in their own namespaces.
func UbuntuPythons(t testing.TB) []Python {
	t.Helper()
	return rootPythons(t, UbuntuRoot+"/usr/bin/", "ubuntu", "python3.13", "python3.14")
}

// EveryPython is every CPython the tests run: the machine's (Pythons), Debian's and
// Ubuntu's in their root (DebianPythons, UbuntuPythons) and the free-threaded build
// (FreeThreadedPython).
func EveryPython(t testing.TB) []Python {
	t.Helper()
	pys := append(append(Pythons(t), DebianPythons(t)...), UbuntuPythons(t)...)
	return append(pys, FreeThreadedPython(t))
}

// rootPythons are the interpreters names in dir of the Debian root.
func rootPythons(t testing.TB, dir, origin string, names ...string) []Python {
	t.Helper()
	root := DebianRoot(t)
	var out []Python
	for _, name := range names {
		path := dir + name
		b, err := exec.Command("chroot", root, path, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])").Output()
		if err != nil {
			Unavailable(t, "%s in %s: %v", path, root, err)
		}
		v := strings.TrimSpace(string(b))
		out = append(out, Python{Name: v + " (" + origin + ")", Version: v, Path: path, Lib: filepath.Join(root, path), Root: root})
	}
	return out
}

// Pythons finds this machine's CPython 3.9 to 3.15: pyenv's versions and the system's
// python3. Fewer than two fails the test in CI, which installs Debian's python3 beside
// the machine image's pyenv versions; elsewhere it skips.
func Pythons(t testing.TB) []Python {
	t.Helper()
	var out []Python
	seen := map[string]bool{}
	add := func(origin, python string) {
		real, err := filepath.EvalSymlinks(python)
		if err != nil || seen[real] {
			return
		}
		b, err := exec.Command(python, "-c", `import sys, sysconfig
print('%d.%d.%d' % sys.version_info[:3])
print(sysconfig.get_config_var('LDLIBRARY') if sysconfig.get_config_var('Py_ENABLE_SHARED') else '')
print(sysconfig.get_config_var('LIBDIR'))`).Output()
		if err != nil {
			return
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) < 3 || !supportedPython(lines[0]) {
			return
		}
		seen[real] = true
		// Debian ships libpython but links its python3 statically: what the program
		// needs tells.
		lib := real
		if lines[1] != "" && needs(real, lines[1]) {
			if l, err := filepath.EvalSymlinks(filepath.Join(lines[2], lines[1])); err == nil {
				lib = l
			}
		}
		out = append(out, Python{Name: lines[0] + " (" + origin + ")", Version: lines[0], Path: python, Lib: lib})
	}
	root := os.Getenv("PYENV_ROOT")
	if root == "" {
		root = "/root/.pyenv"
	}
	found, _ := filepath.Glob(filepath.Join(root, "versions/3.*/bin/python3"))
	sort.Strings(found)
	for _, p := range found {
		add("pyenv", p)
	}
	add("system", "/usr/bin/python3")
	if len(out) < 2 {
		Unavailable(t, "found %d CPython 3.9-3.13 interpreters, want at least 2 (pyenv's, /usr/bin/python3)", len(out))
	}
	return out
}

// needs reports whether an ELF program needs a library whose name starts like lib's.
func needs(program, lib string) bool {
	f, err := elf.Open(program)
	if err != nil {
		return false
	}
	defer f.Close()
	libs, _ := f.ImportedLibraries()
	for _, l := range libs {
		if strings.HasPrefix(l, strings.TrimSuffix(lib, ".so")) {
			return true
		}
	}
	return false
}

func supportedPython(version string) bool {
	for _, p := range []string{"3.9.", "3.10.", "3.11.", "3.12.", "3.13.", "3.14.", "3.15."} {
		if strings.HasPrefix(version, p) {
			return true
		}
	}
	return false
}
