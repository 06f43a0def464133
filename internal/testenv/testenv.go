// Package testenv decides whether tests that need root, BPF or external tools may skip.
// Outside CI they skip with a reason; under CI=true a missing prerequisite fails the test,
// because CI runs as root on a kernel with BPF and must not pass by skipping.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true).
func InCI() bool { return os.Getenv("CI") == "true" }

// Unavailable skips the test outside CI and fails it in CI.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("CI must run this test: "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequireRoot stops the test unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root for BPF")
	}
}

// RequireTool returns the path of an external program the test needs.
func RequireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Unavailable(t, "needs %s on PATH", name)
	}
	return p
}
