package trace

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/sonde-profiler/sonde/internal/procfs"
)

func TestParseMaps(t *testing.T) {
	const maps = `55d0c0a00000-55d0c0a02000 r--p 00000000 fd:01 1234                       /usr/bin/prog
55d0c0a02000-55d0c0a08000 r-xp 00002000 fd:01 1234                       /usr/bin/prog
7f1e2c000000-7f1e2c021000 rw-p 00000000 00:00 0
7f1e2d028000-7f1e2d1bd000 r-xp 00028000 103:02 98765                     /opt/my app/lib/libfoo.so (deleted)
7ffd4e5f0000-7ffd4e5f2000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
`
	got, err := parseMaps(strings.NewReader(maps))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("got %d executable mappings, want 4: %+v", len(got), got)
	}
	prog := got[0]
	if prog.Start != 0x55d0c0a02000 || prog.End != 0x55d0c0a08000 || prog.Offset != 0x2000 ||
		prog.Inode != 1234 || prog.Path != "/usr/bin/prog" || prog.Dev != procfs.MakeDev(0xfd, 1) {
		t.Errorf("prog mapping = %+v", prog)
	}
	if lib := got[1]; lib.Path != "/opt/my app/lib/libfoo.so (deleted)" || lib.Dev != procfs.MakeDev(0x103, 2) {
		t.Errorf("path with spaces and a deleted file: %+v", lib)
	}
	if got[2].Path != "[vdso]" || got[2].Inode != 0 {
		t.Errorf("vdso mapping = %+v", got[2])
	}
	for _, bad := range []string{"zz-10 r-xp 0 00:00 0", "10-5 r-xp 0 00:00 0", "10-20 r-xp 0 0000 0", "10-20 r-xp"} {
		if _, err := procfs.ParseMapsLine(bad); err == nil {
			t.Errorf("ParseMapsLine(%q) succeeded", bad)
		}
	}
}

// The device numbers in maps must match stat's, or files would not be shared across processes.
func TestMapsDeviceMatchesStat(t *testing.T) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Skip("no procfs")
	}
	defer f.Close()
	lines, err := parseMaps(f)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, l := range lines {
		if l.Inode == 0 || !strings.HasPrefix(l.Path, "/") {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat(l.Path, &st); err != nil {
			continue
		}
		if st.Ino != l.Inode || st.Dev != l.Dev {
			t.Errorf("%s: maps says dev %x inode %d, stat says dev %x inode %d", l.Path, l.Dev, l.Inode, st.Dev, st.Ino)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no file-backed executable mapping in /proc/self/maps")
	}
}

// The maps parser reads what any process's /proc/PID/maps says, paths included: it must
// never panic, keep only executable mappings, and never return an end before a start.
func FuzzParseMaps(f *testing.F) {
	f.Add("55d0c0a02000-55d0c0a08000 r-xp 00002000 fd:01 1234                       /usr/bin/prog\n")
	f.Add("7f1e2d028000-7f1e2d1bd000 r-xp 00028000 103:02 98765 /opt/my app/lib/libfoo.so (deleted)\n")
	f.Add("ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]\n10-5 r-xp 0 00:00 0\n")
	f.Add("1-2 r-xp 0 0:0 0 \xff\xfe\n\n1-2 rwxp ffffffffffffffff fffff:ffffff 18446744073709551615 /x")
	f.Fuzz(func(t *testing.T, maps string) {
		lines, err := parseMaps(strings.NewReader(maps))
		if err != nil {
			return
		}
		if len(lines) > maxExecMappings {
			t.Fatalf("%d mappings kept, over the bound of %d", len(lines), maxExecMappings)
		}
		for _, l := range lines {
			if l.End < l.Start || !strings.Contains(l.Perms, "x") {
				t.Fatalf("kept %+v", l)
			}
		}
	})
}
