package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// buildCached builds dir once for this machine: build fills a fresh directory beside it,
// which becomes dir only when build succeeds. Test binaries running at once build it once:
// the first holds dir's lock while the others wait, and find it built.
func buildCached(dir string, logf func(format string, args ...any), build func(tmp string) error) error {
	done := func() bool { _, err := os.Stat(filepath.Join(dir, ".sonde-complete")); return err == nil }
	if done() {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if done() {
		return nil // another test binary built it meanwhile
	}
	tmp := dir + ".building"
	os.RemoveAll(tmp)
	os.RemoveAll(dir)
	t0 := time.Now()
	if err := build(tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".sonde-complete"), nil, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	logf("built %s in %v", dir, time.Since(t0).Round(time.Second))
	return nil
}
