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
	// links the interpreter statically.
	Lib string
}

// Pythons finds this machine's CPython 3.9 to 3.13: pyenv's versions and the system's
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
	for _, p := range []string{"3.9.", "3.10.", "3.11.", "3.12.", "3.13."} {
		if strings.HasPrefix(version, p) {
			return true
		}
	}
	return false
}
