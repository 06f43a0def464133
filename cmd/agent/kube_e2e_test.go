package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/cgroup"
	"github.com/sonde-profiler/sonde/internal/testenv"
)

// --cgroup profiles the processes of a cgroup and those below it; a process in another
// cgroup never appears.
func TestCgroupFlag(t *testing.T) {
	testenv.RequireRoot(t)
	root, err := cgroup.Root("/proc/self/mountinfo")
	if err != nil {
		testenv.Unavailable(t, "no cgroup v2 here: %v", err)
	}
	dir, err := os.MkdirTemp(root, "sonde-flag-")
	if err != nil {
		testenv.Unavailable(t, "cannot make cgroups under %s: %v", root, err)
	}
	other, _ := os.MkdirTemp(root, "sonde-other-")
	inner := filepath.Join(dir, "inner")
	os.Mkdir(inner, 0o755)
	// Registered before the workloads start, so that it runs after they are killed: a
	// cgroup with a process in it cannot be removed, and the kernel frees an exited one's
	// last task a moment later.
	t.Cleanup(func() {
		testenv.Wait("the test's cgroups to be removable", testenv.StartTimeout, func() (bool, string) {
			var errs []string
			for _, d := range []string{inner, dir, other} {
				if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
					errs = append(errs, err.Error())
				}
			}
			return len(errs) == 0, strings.Join(errs, "; ")
		})
	})
	bin := buildWorkload(t, "chain", chainC, "-O2")
	in, out := startWorkload(t, bin, 30), startWorkload(t, bin, 30)
	os.WriteFile(filepath.Join(inner, "cgroup.procs"), []byte(strconv.Itoa(in.Process.Pid)), 0o644)
	os.WriteFile(filepath.Join(other, "cgroup.procs"), []byte(strconv.Itoa(out.Process.Pid)), 0o644)
	prof := filepath.Join(t.TempDir(), "cg.pb.gz")
	if _, stderr, err := runSonde(t, "--cgroup", filepath.Base(dir), "--duration", "2s", "--frequency", "99", "--output", prof, "--top", "0"); err != nil {
		t.Fatalf("sonde: %v\n%s", err, stderr)
	}
	pids := map[int64]int64{}
	for _, s := range readProfile(t, prof).Sample {
		pids[s.NumLabel["pid"][0]] += s.Value[0]
	}
	if pids[int64(in.Process.Pid)] == 0 || len(pids) != 1 {
		t.Errorf("samples by pid %v: want only %d, the process below the cgroup", pids, in.Process.Pid)
	}
	if _, stderr, err := runSonde(t, "--cgroup", "no-such-cgroup", "--duration", "1s"); err == nil || !strings.Contains(stderr, "--cgroup") {
		t.Errorf("a missing cgroup: %v\n%s", err, stderr)
	}
}
