package procfs

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestParseMounts(t *testing.T) {
	got := ParseMounts(`22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
90 80 0:38 /kubepods/pod1 /mnt/my\040cgroup rw - cgroup2 cgroup2 rw
not a mount line
`)
	if fmt.Sprint(got) != "[{/ /sys sysfs} {/ /sys/fs/cgroup/unified cgroup2} {/kubepods/pod1 /mnt/my cgroup cgroup2}]" {
		t.Errorf("mounts %v", got)
	}
}

func TestScanMaps(t *testing.T) {
	maps := "1000-2000 r-xp 00000000 fd:01 12 /bin/a b\n\n3000-4000 rw-p 00000000 00:00 0\n"
	var got []Mapping
	if err := ScanMaps(strings.NewReader(maps), func(m Mapping) bool { got = append(got, m); return true }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Path != "/bin/a b" || got[0].Dev != MakeDev(0xfd, 1) || got[1].Path != "" || got[1].Inode != 0 {
		t.Errorf("mappings %+v", got)
	}
	err := ScanMaps(strings.NewReader("1000-2000 r-xp\n"), func(Mapping) bool { return true })
	if err == nil || !strings.Contains(err.Error(), "maps line 1") {
		t.Errorf("a short line: %v", err)
	}
	if StatmResident([]byte("100 25 3 1 0 20 0")) <= 0 || StatmResident([]byte("1")) != 0 {
		t.Error("statm's resident pages")
	}
}

// TestDescendants finds a shell's children and grandchildren, and reads a parent from a
// stat line whose command name holds spaces and parentheses.
func TestDescendants(t *testing.T) {
	cmd := exec.Command("sh", "-c", "(sleep 30; true) & sleep 30; true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	root := uint32(cmd.Process.Pid)
	var got []uint32
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = Descendants("/proc", []uint32{root}, 100); len(got) >= 4 {
			break
		}
	}
	if len(got) < 4 || got[0] != root {
		t.Fatalf("descendants of %d: %v, want it, two children and a grandchild", root, got)
	}
	if got := Descendants("/proc", []uint32{root}, 2); len(got) != 2 {
		t.Errorf("bounded at 2: %v", got)
	}
	if ppid, ok := StatParent([]byte("42 (a) b (c)) S 17 42 42 0")); !ok || ppid != 17 {
		t.Errorf("parent %d %v, want 17", ppid, ok)
	}
}
