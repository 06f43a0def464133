package cgroup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	cid        = "3f1b7c2e9a4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7"
	testPodUID = "0d1c4a2e-5b7f-4c1e-9a3d-2f6b8e7c1a90"
	// The kubelet names a static pod's cgroup after its config hash, not an API UID.
	staticHash = "6b3ffd12d0b7a8e3e7c1f2a9b4d5c6e7"
)

// TestParseLayouts checks each runtime's cgroup layout, as the kernel prints it, in
// testdata/layouts.
func TestParseLayouts(t *testing.T) {
	podSlice := "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(testPodUID, "-", "_") + ".slice"
	tests := map[string]Info{
		"containerd-systemd-v2":      {Path: podSlice + "/cri-containerd-" + cid + ".scope", ContainerID: cid, PodUID: testPodUID, Runtime: RuntimeContainerd},
		"containerd-cgroupfs-v1":     {Path: "/", ContainerID: cid, PodUID: testPodUID},
		"containerd-cgroupfs-v2":     {Path: "/kubepods/besteffort/pod" + testPodUID + "/" + cid, ContainerID: cid, PodUID: testPodUID},
		"containerd-colon-v1":        {Path: "/system.slice/containerd.service/kubepods-burstable-pod" + strings.ReplaceAll(testPodUID, "-", "_") + ".slice:cri-containerd:" + cid, ContainerID: cid, PodUID: testPodUID, Runtime: RuntimeContainerd},
		"crio-systemd-v2":            {Path: "/kubepods.slice/kubepods-pod" + strings.ReplaceAll(testPodUID, "-", "_") + ".slice/crio-" + cid + ".scope", ContainerID: cid, PodUID: testPodUID, Runtime: RuntimeCRIO},
		"crio-conmon-v2":             {Path: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(testPodUID, "-", "_") + ".slice/crio-conmon-" + cid + ".scope", PodUID: testPodUID},
		"crio-cgroupfs-v1":           {Path: "/kubepods/burstable/pod" + testPodUID + "/crio-" + cid, ContainerID: cid, PodUID: testPodUID, Runtime: RuntimeCRIO},
		"docker-systemd-v2":          {Path: "/system.slice/docker-" + cid + ".scope", ContainerID: cid, Runtime: RuntimeDocker},
		"docker-cgroupfs-v1":         {Path: "/docker/" + cid, ContainerID: cid, Runtime: RuntimeDocker},
		"docker-kubepods-systemd-v2": {Path: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(testPodUID, "-", "_") + ".slice/docker-" + cid + ".scope", ContainerID: cid, PodUID: testPodUID, Runtime: RuntimeDocker},
		"docker-hybrid":              {Path: "/system.slice/docker-" + cid + ".scope", ContainerID: cid, Runtime: RuntimeDocker},
		"podman-systemd-v2":          {Path: "/machine.slice/libpod-" + cid + ".scope/container", ContainerID: cid, Runtime: RuntimePodman},
		"podman-rootless-v2":         {Path: "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + cid + ".scope/container", ContainerID: cid, Runtime: RuntimePodman},
		"podman-cgroupfs-v1":         {Path: "/libpod_parent/libpod-" + cid, ContainerID: cid, Runtime: RuntimePodman},
		"hybrid-host":                {Path: "/"},
		"host-v2":                    {Path: "/system.slice/sshd.service"},
		"kthread-v2":                 {Path: "/"},
		"static-pod-v2":              {Path: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + staticHash + ".slice/cri-containerd-" + cid + ".scope", ContainerID: cid, PodUID: staticHash, Runtime: RuntimeContainerd},
		"pod-only-v2":                {Path: podSlice, PodUID: testPodUID},
		// Paths read from inside a container's cgroup namespace climb out of it first.
		"cgroupns-relative-v2": {Path: "/../../kubepods-besteffort-pod" + strings.ReplaceAll(testPodUID, "-", "_") + ".slice/cri-containerd-" + cid + ".scope", ContainerID: cid, PodUID: testPodUID, Runtime: RuntimeContainerd},
		// A container that names a sub-cgroup after another container is still itself.
		"nested-forgery-v2": {Path: podSlice + "/cri-containerd-" + cid + ".scope/cri-containerd-aa11bb22cc33dd44ee55ff6600771188aa99bb00cc11dd22ee33ff4400556677.scope", ContainerID: cid, PodUID: testPodUID, Runtime: RuntimeContainerd},
	}
	files, err := filepath.Glob("testdata/layouts/*.cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(tests) {
		t.Errorf("%d fixtures in testdata/layouts, %d expectations: each fixture needs one", len(files), len(tests))
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".cgroup")
		t.Run(name, func(t *testing.T) {
			want, ok := tests[name]
			if !ok {
				t.Fatalf("no expectation for %s", file)
			}
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Parse(b)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got != want {
				t.Errorf("Parse =\n %+v\nwant\n %+v", got, want)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	for name, in := range map[string]string{
		"empty":              "",
		"no colon":           "garbage\n",
		"one colon":          "0:/\n",
		"bad id":             "x::/\n",
		"relative path":      "0::kubepods\n",
		"v2 twice":           "0::/a\n0::/kubepods/pod" + testPodUID + "/" + cid + "\n",
		"v1 hierarchy twice": "4:memory:/a\n4:memory:/b\n",
		"too long":           "0::/" + strings.Repeat("a", MaxInput) + "\n",
		"path too long":      "0::/" + strings.Repeat("a", maxPath) + "\n",
		"too many lines":     strings.Repeat("1:cpu:/\n", maxLines+1),
	} {
		if info, err := Parse([]byte(in)); err == nil {
			t.Errorf("%s: Parse = %+v, want an error", name, info)
		}
	}
}

func TestNormalUID(t *testing.T) {
	for in, want := range map[string]string{
		testPodUID:                               testPodUID,
		strings.ReplaceAll(testPodUID, "-", "_"): testPodUID,
		strings.ToUpper(testPodUID):              testPodUID,
		staticHash:                               staticHash,
		"0d1c4a2e-5b7f-4c1e-9a3d-2f6b8e7c1a9":    "",
		"0d1c4a2e-5b7f-4c1e-9a3d+2f6b8e7c1a90":   "",
		"0d1c4a2e-5b7f-4c1e-9a3d-2f6b8e7c1a9g":   "",
		"":                                       "",
	} {
		if got := normalUID(in); got != want {
			t.Errorf("normalUID(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzParse: Parse never panics, and what it returns is well formed whatever the paths
// hold.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/layouts/*.cgroup")
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		info, err := Parse(b)
		if err != nil {
			if info != (Info{}) {
				t.Fatalf("error %v with a non-zero Info %+v", err, info)
			}
			return
		}
		if info.ContainerID != "" && !isID(info.ContainerID) {
			t.Fatalf("container id %q is not 64 hex digits", info.ContainerID)
		}
		if info.PodUID != "" && normalUID(info.PodUID) != info.PodUID {
			t.Fatalf("pod UID %q is not normalised", info.PodUID)
		}
		if info.Runtime != "" && info.ContainerID == "" {
			t.Fatalf("runtime %q without a container", info.Runtime)
		}
		if info.Path != "" && !strings.Contains(string(b), info.Path) {
			t.Fatalf("path %q is not in the input", info.Path)
		}
	})
}
