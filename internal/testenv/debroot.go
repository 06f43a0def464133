package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// SidPackages are Debian's packages of the runtimes the tests run as a container's base
// image ships them: one root holds them all, built once. ruby3.4 is in experimental only.
var SidPackages = []string{"python3.13", "python3.14", "python3.15", "zlib1g", "php8.4-cli", "ruby3.3", "ruby3.4"}

// debianSuite is the suite the root is built from: sid, where the newest runtimes land
// first; debianSources are the archive's parts it draws on: experimental's packages are
// installed only where sid has none of the name.
const debianSuite = "sid"

var debianSources = []string{
	"deb http://deb.debian.org/debian sid main",
	"deb http://deb.debian.org/debian experimental main",
}

// UbuntuRoot is where the root holds Ubuntu's own builds of CPython (UbuntuPythons),
// unpacked from Ubuntu's packages: they run on the root's libraries, their standard
// library found beside them.
const UbuntuRoot = "/opt/ubuntu"

// ubuntuDebs are those packages, from Ubuntu 25.10 (3.13) and 26.04 LTS (3.14), pinned by
// the SHA-256 their suites' Packages indexes give.
var ubuntuDebs = []struct{ path, sha256 string }{
	{"pool/main/p/python3.13/python3.13-minimal_3.13.7-1_amd64.deb", "d5b4c8be95adede3d584b1ab02a5868aa19fa0a75aba2284c7bd6b065c9c47de"},
	{"pool/main/p/python3.13/libpython3.13-minimal_3.13.7-1_amd64.deb", "28e4ec81135f7e6125ee1bde4b4635988a4963bdd94a59405337249d1d4fc0cd"},
	{"pool/main/p/python3.13/libpython3.13-stdlib_3.13.7-1_amd64.deb", "41917dfe8eda4678309800daf70848b6b04e7a87b0bbf34b4ffdbffd3e503a24"},
	{"pool/main/p/python3.14/python3.14-minimal_3.14.4-1_amd64.deb", "7c25ce41fc15cd737664bea334cd941ecd0c64b3f51523c44c51254e7dfd7926"},
	{"pool/main/p/python3.14/libpython3.14-minimal_3.14.4-1_amd64.deb", "3552dd7d4b8c6bf1b25dba129290fc46b6421197587e2e211aa0dbe5f8beea54"},
	{"pool/main/p/python3.14/libpython3.14-stdlib_3.14.4-1_amd64.deb", "3b73ea5df272886f6bca236798eea769b8bc2b99337a55a0ae5f779b310a918c"},
}

const ubuntuMirror = "http://archive.ubuntu.com/ubuntu"

// unpackUbuntu unpacks ubuntuDebs into root's UbuntuRoot.
func unpackUbuntu(root string) error {
	dir := filepath.Join(root, UbuntuRoot)
	for _, d := range ubuntuDebs {
		b, err := httpGet(ubuntuMirror + "/" + d.path)
		if err != nil {
			return err
		}
		if err := checkSHA256(b, d.sha256, filepath.Base(d.path)); err != nil {
			return err
		}
		deb := filepath.Join(root, "tmp", filepath.Base(d.path))
		if err := os.WriteFile(deb, b, 0o644); err != nil {
			return err
		}
		out, err := exec.Command("dpkg-deb", "-x", deb, dir).CombinedOutput()
		os.Remove(deb)
		if err != nil {
			return fmt.Errorf("dpkg-deb -x %s: %v\n%s", filepath.Base(d.path), err, out)
		}
	}
	// The packages' scripts would compile the standard library; a program importing a
	// module of it (asyncio) would otherwise spend its first seconds compiling.
	for _, v := range []string{"3.13", "3.14"} {
		lib := UbuntuRoot + "/usr/lib/python" + v
		if out, err := exec.Command("chroot", root, UbuntuRoot+"/usr/bin/python"+v, "-m", "compileall", "-q", "-j", "0", lib).CombinedOutput(); err != nil {
			return fmt.Errorf("compile %s: %v\n%s", lib, err, tail(out, 2000))
		}
	}
	return nil
}

// DebianRoot returns a Debian root holding SidPackages, built with mmdebstrap from
// Debian's archive the first time a test asks and kept for the test binaries of the run
// (and later runs on the machine) under $SONDE_DEBROOT_CACHE, else /var/tmp/sonde-debroot,
// by suite and packages. Test binaries running at once build it once: the first holds a
// lock while the others wait.
func DebianRoot(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "a Debian root needs root")
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		Unavailable(t, "a Debian root needs mmdebstrap (apt-get install mmdebstrap)")
	}
	root, err := BuildDebianRoot(func(format string, args ...any) { t.Logf(format, args...) })
	if err != nil {
		Unavailable(t, "debian root: %v", err)
	}
	return root
}

// BuildDebianRoot builds the root DebianRoot returns, if no complete one is cached, and
// returns its path. logf hears what it does.
func BuildDebianRoot(logf func(format string, args ...any)) (string, error) {
	cache := os.Getenv("SONDE_DEBROOT_CACHE")
	if cache == "" {
		cache = "/var/tmp/sonde-debroot"
	}
	key := debianSuite + " " + strings.Join(SidPackages, ",") + " " + strings.Join(debianSources, ",")
	for _, d := range ubuntuDebs {
		key += " " + d.sha256
	}
	key += " compiled"
	sum := sha256.Sum256([]byte(key))
	root := filepath.Join(cache, debianSuite+"-"+hex.EncodeToString(sum[:6]))
	return root, buildCached(root, logf, func(tmp string) error {
		logf("building a Debian %s root with %s", debianSuite, strings.Join(SidPackages, ", "))
		// The archive's Release files of a mirror snapshot may have expired; the packages'
		// signatures are still checked.
		cmd := exec.Command("mmdebstrap", append([]string{"--variant=apt", `--aptopt=Acquire::Check-Valid-Until "false"`,
			"--include=" + strings.Join(SidPackages, ","), debianSuite, tmp}, debianSources...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("mmdebstrap: %v\n%s", err, tail(out, 2000))
		}
		if err := unpackUbuntu(tmp); err != nil {
			return fmt.Errorf("ubuntu's pythons: %w", err)
		}
		return nil
	})
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// contained maps the commands Contained made to their roots.
var contained sync.Map

// Contained returns a command that runs a program inside root as a container's: in its
// own mount and PID namespaces (the program is PID 1 there), root as its /. The program
// dies with the command (unshare --kill-child); ProgramPID tells its PID on the host once
// it runs.
func Contained(root string, args ...string) *exec.Cmd {
	cmd := exec.Command("unshare", append([]string{"--mount", "--pid", "--fork", "--kill-child", "--mount-proc=" + filepath.Join(root, "proc"),
		"chroot", root}, args...)...)
	contained.Store(cmd, root)
	return cmd
}

// ProgramPID returns the host PID of a started command's program: the command's own, or
// for a Contained one the program's once it has been executed in the root.
func ProgramPID(cmd *exec.Cmd) (int, error) {
	r, ok := contained.Load(cmd)
	if !ok {
		return cmd.Process.Pid, nil
	}
	root := r.(string)
	var pid int
	err := Wait(fmt.Sprintf("the program of %v to start in its root", cmd.Args[len(cmd.Args)-1]), 30*time.Second, func() (bool, string) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
		if err != nil {
			return false, err.Error()
		}
		for _, f := range strings.Fields(string(b)) {
			child, _ := strconv.Atoi(f)
			exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", child))
			if err == nil && strings.HasPrefix(exe, root+"/") {
				pid = child
				return true, ""
			}
		}
		return false, "children " + strings.TrimSpace(string(b))
	})
	if err != nil {
		return 0, errors.Join(err, errors.New("is CONFIG_PROC_CHILDREN set?"))
	}
	return pid, nil
}

// CopyInto writes a file of the host into root at path (absolute inside the root), for a
// contained program to run, and returns path. Test binaries sharing the root write the
// same bytes; the rename makes each write whole.
func CopyInto(t testing.TB, root, hostFile, path string) string {
	t.Helper()
	b, err := os.ReadFile(hostFile)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(root, path)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := fmt.Sprintf("%s.%d", dst, os.Getpid())
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
	return path
}
