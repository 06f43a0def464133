package cgroup

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sonde-profiler/sonde/internal/procfs"
)

// ErrNotCgroup2 is returned by ID for a path outside a cgroup v2 file system: a v1
// hierarchy's directories have inode numbers too, but BPF never reports them.
var ErrNotCgroup2 = errors.New("not a cgroup v2 directory")

// ID returns the cgroup v2 id of the cgroup directory at path (a file system path such
// as /sys/fs/cgroup/kubepods.slice): the number bpf_get_current_cgroup_id returns for the
// processes in that cgroup. On 64-bit kernels that id is the kernfs node id, which is
// also the directory's inode number.
func ID(path string) (uint64, error) {
	// One descriptor for both checks, so the file system and the inode are the same
	// directory's even if the path is renamed meanwhile.
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("cgroup id of %s: %w", path, err)
	}
	defer unix.Close(fd)
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return 0, fmt.Errorf("cgroup id of %s: %w", path, err)
	}
	if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return 0, fmt.Errorf("cgroup id of %s: %w", path, ErrNotCgroup2)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("cgroup id of %s: %w", path, err)
	}
	return st.Ino, nil
}

// Root finds where the cgroup v2 hierarchy is mounted, from the mount table in
// mountinfo (/proc/self/mountinfo): /sys/fs/cgroup on unified hosts,
// /sys/fs/cgroup/unified on hybrid ones.
func Root(mountinfo string) (string, error) {
	mounts, err := procfs.Mounts(mountinfo)
	if err != nil {
		return "", fmt.Errorf("find the cgroup v2 mount: %w", err)
	}
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			return m.Dir, nil
		}
	}
	return "", fmt.Errorf("find the cgroup v2 mount: none in %s: %w", mountinfo, ErrNotCgroup2)
}

// FindPod finds the cgroup directory of a Kubernetes pod under root, the cgroup v2 root
// of the host: kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice
// with the systemd driver (dashes in the UID turned to underscores), kubepods/burstable/
// pod<uid> with the cgroupfs one, each with or without the QoS level. uid may also be a
// static pod's config hash.
func FindPod(root, uid string) (string, error) {
	want := []string{"pod" + uid, "pod" + strings.ReplaceAll(uid, "-", "_")}
	matches := func(name string) bool {
		for _, w := range want {
			if name == w || strings.HasSuffix(name, "-"+w+".slice") {
				return true
			}
		}
		return false
	}
	// Breadth first, three levels: the kubelet's top, the QoS level, the pod.
	level := []string{root}
	for depth := 0; depth < 3; depth++ {
		var next []string
		for _, dir := range level {
			entries, err := os.ReadDir(dir)
			if err != nil {
				continue
			}
			for _, e := range entries {
				if !e.IsDir() {
					continue
				}
				name := e.Name()
				path := dir + "/" + name
				if depth > 0 && matches(name) {
					return path, nil
				}
				if strings.HasPrefix(name, "kubepods") || strings.HasPrefix(name, "burstable") || strings.HasPrefix(name, "besteffort") {
					next = append(next, path)
				}
			}
		}
		level = next
	}
	return "", fmt.Errorf("no cgroup for pod %s under %s", uid, root)
}
