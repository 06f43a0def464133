package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// PHP is a PHP CLI the tests run workloads on.
type PHP struct {
	Name    string // "8.2.36 (debian 12)"
	Version string // "8.2.36"
	Path    string // the program
	// Root, where not empty, is the Debian root it runs in as a container's (DebianPHP):
	// Path is inside it.
	Root string
}

// Command runs PHP with args: on the host, or Contained in its root.
func (p PHP) Command(args ...string) *exec.Cmd {
	if p.Root != "" {
		return Contained(p.Root, append([]string{p.Path}, args...)...)
	}
	return exec.Command(p.Path, args...)
}

// Script returns the path PHP runs a host file by: the file's own, or a copy in its root,
// at /sonde-test/ and the file's name.
func (p PHP) Script(t testing.TB, hostFile string) string {
	t.Helper()
	if p.Root == "" {
		return hostFile
	}
	return CopyInto(t, p.Root, hostFile, "/sonde-test/"+filepath.Base(hostFile))
}

// File is the engine's file on the host, for tests that inspect it.
func (p PHP) File() string { return filepath.Join(p.Root, p.Path) }

// version asks a PHP its version.
func (p PHP) version(t testing.TB) string {
	t.Helper()
	cmd := exec.Command(p.Path, "-r", "echo PHP_VERSION;")
	if p.Root != "" {
		cmd = exec.Command("chroot", p.Root, p.Path, "-r", "echo PHP_VERSION;")
	}
	b, err := cmd.Output()
	if err != nil {
		Unavailable(t, "%s: %v", p.File(), err)
	}
	return strings.TrimSpace(string(b))
}

// HostPHP is Debian 12's PHP 8.2 CLI (apt-get install php8.2-cli php8.2-opcache), which
// CI installs.
func HostPHP(t testing.TB) PHP {
	t.Helper()
	const path = "/usr/bin/php8.2"
	if _, err := os.Stat(path); err != nil {
		Unavailable(t, "no %s (apt-get install php8.2-cli php8.2-opcache php8.2-fpm)", path)
	}
	p := PHP{Path: path}
	p.Version = p.version(t)
	p.Name = p.Version + " (debian 12)"
	return p
}

// HostPHPFPM is Debian 12's php-fpm 8.2 (apt-get install php8.2-fpm).
func HostPHPFPM(t testing.TB) string {
	t.Helper()
	const path = "/usr/sbin/php-fpm8.2"
	if _, err := os.Stat(path); err != nil {
		Unavailable(t, "no %s (apt-get install php8.2-fpm)", path)
	}
	return path
}

// HostLibPHP is Debian 12's libphp8.2.so, the embed SAPI's library (apt-get install
// libphp8.2-embed).
func HostLibPHP(t testing.TB) string {
	t.Helper()
	const path = "/usr/lib/libphp8.2.so"
	if _, err := os.Stat(path); err != nil {
		Unavailable(t, "no %s (apt-get install libphp8.2-embed)", path)
	}
	return path
}

// DebianPHP is Debian sid's PHP 8.4 CLI, in the Debian root (DebianRoot), run in its own
// namespaces as a container runs it.
func DebianPHP(t testing.TB) PHP {
	t.Helper()
	p := PHP{Path: "/usr/bin/php8.4", Root: DebianRoot(t)}
	p.Version = p.version(t)
	p.Name = p.Version + " (debian sid)"
	return p
}
