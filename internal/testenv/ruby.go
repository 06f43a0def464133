package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Ruby is a CRuby the tests run workloads on.
type Ruby struct {
	Name    string // "3.1.2 (debian 12)"
	Version string // "3.1.2"
	Path    string // the program
	// Root, where not empty, is the Debian root it runs in as a container's (DebianRuby):
	// Path is inside it.
	Root string
	// Flags go before a command's arguments ("--yjit").
	Flags []string
}

// Command runs Ruby with args: on the host, or Contained in its root.
func (r Ruby) Command(args ...string) *exec.Cmd {
	args = append(append([]string(nil), r.Flags...), args...)
	if r.Root != "" {
		return Contained(r.Root, append([]string{r.Path}, args...)...)
	}
	return exec.Command(r.Path, args...)
}

// Script returns the path Ruby runs a host file by: the file's own, or a copy in its root,
// at /sonde-test/ and the file's name.
func (r Ruby) Script(t testing.TB, hostFile string) string {
	t.Helper()
	if r.Root == "" {
		return hostFile
	}
	return CopyInto(t, r.Root, hostFile, "/sonde-test/"+filepath.Base(hostFile))
}

func (r Ruby) version(t testing.TB) string {
	t.Helper()
	cmd := exec.Command(r.Path, "-e", "print RUBY_VERSION")
	if r.Root != "" {
		cmd = exec.Command("chroot", r.Root, r.Path, "-e", "print RUBY_VERSION")
	}
	b, err := cmd.Output()
	if err != nil {
		Unavailable(t, "%s: %v", filepath.Join(r.Root, r.Path), err)
	}
	return strings.TrimSpace(string(b))
}

// HostRuby is Debian 12's Ruby 3.1 (apt-get install ruby3.1), which CI installs.
func HostRuby(t testing.TB) Ruby {
	t.Helper()
	const path = "/usr/bin/ruby3.1"
	if _, err := os.Stat(path); err != nil {
		Unavailable(t, "no %s (apt-get install ruby3.1)", path)
	}
	r := Ruby{Path: path}
	r.Version = r.version(t)
	r.Name = r.Version + " (debian 12)"
	return r
}

// DebianRuby is Debian sid's Ruby 3.3, in the Debian root (DebianRoot), run in its own
// namespaces as a container runs it.
func DebianRuby(t testing.TB) Ruby { return debianRuby(t, "3.3", "debian sid") }

// DebianRuby34 is Debian experimental's Ruby 3.4, in the Debian root, as DebianRuby.
func DebianRuby34(t testing.TB) Ruby { return debianRuby(t, "3.4", "debian experimental") }

func debianRuby(t testing.TB, minor, from string) Ruby {
	t.Helper()
	r := Ruby{Path: "/usr/bin/ruby" + minor, Root: DebianRoot(t)}
	r.Version = r.version(t)
	r.Name = r.Version + " (" + from + ")"
	return r
}
