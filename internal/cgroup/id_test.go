package cgroup

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// cgroup2Mount finds where the unified hierarchy is mounted: /sys/fs/cgroup on
// cgroup v2 hosts, /sys/fs/cgroup/unified on hybrid ones.
func cgroup2Mount(t *testing.T) string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		pre, post, ok := strings.Cut(s.Text(), " - ")
		if fields := strings.Fields(pre); ok && strings.HasPrefix(post, "cgroup2 ") && len(fields) > 4 && fields[3] == "/" {
			return fields[4]
		}
	}
	testenv.Unavailable(t, "no cgroup v2 hierarchy mounted")
	return ""
}

func TestIDOfRoot(t *testing.T) {
	id, err := ID(cgroup2Mount(t))
	if err != nil {
		t.Fatal(err)
	}
	// The kernel numbers the root cgroup's kernfs node 1.
	if id != 1 {
		t.Errorf("ID(root) = %d, want 1", id)
	}
}

func TestIDRejects(t *testing.T) {
	if _, err := ID("/proc"); !errors.Is(err, ErrNotCgroup2) {
		t.Errorf("ID(/proc) = %v, want ErrNotCgroup2", err)
	}
	if _, err := ID(filepath.Join(cgroup2Mount(t), "cgroup.procs")); err == nil {
		t.Error("ID of a cgroup file, not a directory: want an error")
	}
	if _, err := ID(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("ID of a missing path: want an error")
	}
}

// TestIDIsBPFCgroupID makes a cgroup, puts a child process in it and has the child ask
// BPF for its cgroup id: it must be what ID says of the directory.
func TestIDIsBPFCgroupID(t *testing.T) {
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp(cgroup2Mount(t), "sonde-test-")
	if err != nil {
		testenv.Unavailable(t, "cannot make a cgroup: %v", err)
	}
	defer os.Remove(dir) // after the child has exited, the cgroup is empty
	want, err := ID(dir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperBPFCgroupID$")
	cmd.Env = append(os.Environ(), "SONDE_CGROUP_HELPER="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	got, err := strconv.ParseUint(strings.TrimPrefix(line, "cgroup id "), 10, 64)
	if err != nil {
		t.Fatalf("helper printed %q", out)
	}
	if got != want || want == 1 {
		t.Errorf("bpf_get_current_cgroup_id in %s = %d, ID = %d (1 is the root's)", dir, got, want)
	}
	t.Logf("cgroup %s: id %d", dir, got)
}

// TestHelperBPFCgroupID runs in the child of TestIDIsBPFCgroupID only.
func TestHelperBPFCgroupID(t *testing.T) {
	dir := os.Getenv("SONDE_CGROUP_HELPER")
	if dir == "" {
		t.Skip("helper process of TestIDIsBPFCgroupID")
	}
	// Writing 0 moves the writing process, so every thread the BPF program may run on.
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte("0"), 0); err != nil {
		t.Fatal(err)
	}
	// A syscall program runs in the calling task when tested, and may call
	// bpf_get_current_cgroup_id; it leaves the id in its context, which comes back.
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:  ebpf.Syscall,
		Flags: unix.BPF_F_SLEEPABLE,
		Instructions: asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.FnGetCurrentCgroupId.Call(),
			asm.StoreMem(asm.R6, 0, asm.R0, asm.DWord),
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		},
		License: "GPL",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	ctx := make([]byte, 8)
	var out [8]byte
	if _, err := prog.Run(&ebpf.RunOptions{Context: ctx, ContextOut: &out}); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("cgroup id %d\n", binary.NativeEndian.Uint64(out[:]))
}

func TestRootFromMountinfo(t *testing.T) {
	dir := t.TempDir()
	mi := filepath.Join(dir, "mountinfo")
	os.WriteFile(mi, []byte("22 1 0:21 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n36 22 0:31 / /sys/fs/cgroup/uni\\040fied rw - cgroup2 cgroup2 rw\n"), 0o644)
	if got, err := Root(mi); err != nil || got != "/sys/fs/cgroup/uni fied" {
		t.Errorf("Root = %q, %v", got, err)
	}
	os.WriteFile(mi, []byte("22 1 0:21 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"), 0o644)
	if _, err := Root(mi); !errors.Is(err, ErrNotCgroup2) {
		t.Errorf("v1 only: %v", err)
	}
	if got, err := Root("/proc/self/mountinfo"); err == nil {
		if _, err := ID(got); err != nil {
			t.Errorf("the host's cgroup v2 root %s: %v", got, err)
		}
	}
}

func TestFindPod(t *testing.T) {
	const uid = "1c1e1b8a-7f2d-4f6e-9a3b-2c5d8e9f0a1b"
	for _, layout := range []string{
		"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1c1e1b8a_7f2d_4f6e_9a3b_2c5d8e9f0a1b.slice",
		"kubepods.slice/kubepods-pod1c1e1b8a_7f2d_4f6e_9a3b_2c5d8e9f0a1b.slice",
		"kubepods/besteffort/pod1c1e1b8a-7f2d-4f6e-9a3b-2c5d8e9f0a1b",
		"kubepods/pod1c1e1b8a-7f2d-4f6e-9a3b-2c5d8e9f0a1b",
	} {
		root := t.TempDir()
		want := filepath.Join(root, layout)
		os.MkdirAll(filepath.Join(want, "cri-containerd-abc.scope"), 0o755)
		os.MkdirAll(filepath.Join(root, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podother.slice"), 0o755)
		got, err := FindPod(root, uid)
		if err != nil || got != want {
			t.Errorf("%s: FindPod = %q, %v", layout, got, err)
		}
	}
	if _, err := FindPod(t.TempDir(), uid); err == nil {
		t.Error("found a pod in an empty hierarchy")
	}
}
