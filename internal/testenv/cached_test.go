package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestBuildCached builds a directory once, keeps nothing of a failed build, and builds
// again after one.
func TestBuildCached(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "thing")
	logf := func(string, ...any) {}
	boom := errors.New("boom")
	if err := buildCached(dir, logf, func(tmp string) error {
		os.MkdirAll(tmp, 0o755)
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("failed build: %v", err)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatal("a failed build left its directory")
	}
	builds := 0
	for range 2 {
		if err := buildCached(dir, logf, func(tmp string) error {
			builds++
			if err := os.MkdirAll(tmp, 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(tmp, "made"), []byte("x"), 0o644)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if builds != 1 {
		t.Errorf("%d builds, want 1", builds)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "made")); err != nil || string(b) != "x" {
		t.Errorf("built directory: %q %v", b, err)
	}
}
