package objfile

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
)

const helloC = `#include <stdio.h>
__attribute__((noinline)) int work(int n){int s=0;for(int i=0;i<n;i++)s+=i*i;return s;}
int main(int argc,char**argv){printf("%d\n",work(argc*1000));return 0;}
`

func identityOf(t *testing.T, path string) Identity {
	t.Helper()
	h, err := OpenHost(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	id, err := ReadIdentity(h, h.Size())
	if err != nil {
		t.Fatalf("ReadIdentity(%s): %v", path, err)
	}
	return id
}

func TestGNUBuildIDMatchesReadelf(t *testing.T) {
	readelf := testenv.RequireTool(t, "readelf")
	bin := testprog.BuildC(t, helloC, "-O1", "-Wl,--build-id=sha1")
	out, err := exec.Command(readelf, "-n", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`Build ID: ([0-9a-f]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("readelf shows no build id:\n%s", out)
	}
	id := identityOf(t, bin)
	if id.GNUBuildID != string(m[1]) {
		t.Errorf("build id %q, readelf says %q", id.GNUBuildID, m[1])
	}
	if id.IsGo || id.HTLHash != "" {
		t.Errorf("C binary with build id: %+v", id)
	}
}

func TestFileWithoutBuildIDIsHashed(t *testing.T) {
	a := testprog.BuildC(t, helloC, "-O1", "-Wl,--build-id=none")
	// The names differ, and with them the symbol table at the end of the file.
	b := testprog.BuildC(t, strings.ReplaceAll(helloC, "work", "labor"), "-O1", "-Wl,--build-id=none")
	ida, idb := identityOf(t, a), identityOf(t, b)
	if ida.GNUBuildID != "" || len(ida.HTLHash) != 32 {
		t.Fatalf("want a 128-bit hash and no build id: %+v", ida)
	}
	if ida.HTLHash == idb.HTLHash {
		t.Errorf("different files hash alike: %s", ida.HTLHash)
	}
	if again := identityOf(t, a); again.HTLHash != ida.HTLHash {
		t.Errorf("hash not stable: %s then %s", ida.HTLHash, again.HTLHash)
	}
}

func TestGoBuildID(t *testing.T) {
	goTool := testenv.RequireTool(t, "go")
	bin := testprog.BuildGo(t, "package main\nfunc main(){}\n")
	want, err := exec.Command(goTool, "tool", "buildid", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	id := identityOf(t, bin)
	if !id.IsGo || id.GoBuildID != strings.TrimSpace(string(want)) {
		t.Errorf("go binary identity %+v, go tool buildid says %q", id, want)
	}
}

func TestCorruptELF(t *testing.T) {
	bin := testprog.BuildC(t, helloC, "-O1")
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, cut := range []int{0, 16, 64, len(data) / 3} {
		p := filepath.Join(t.TempDir(), "cut")
		os.WriteFile(p, data[:cut], 0o644)
		h, err := OpenHost(p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = ReadIdentity(h, h.Size())
		h.Close()
		if cut < 64 && err == nil {
			t.Errorf("truncated to %d bytes: no error", cut)
		}
	}
}

func TestKernelBuildID(t *testing.T) {
	data, err := os.ReadFile("/sys/kernel/notes")
	if err != nil {
		testenv.Unavailable(t, "no /sys/kernel/notes: %v", err)
	}
	id, err := ParseKernelNotes(data)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(id) {
		t.Errorf("kernel build id %q", id)
	}
}

// note builds one ELF note.
func note(name string, typ uint32, desc []byte) []byte {
	n := append([]byte(name), 0)
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(n)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(desc)))
	b = binary.LittleEndian.AppendUint32(b, typ)
	b = append(b, n...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	b = append(b, desc...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func TestParseNotes(t *testing.T) {
	data := append(note("stapsdt", 3, []byte("probe")), note("GNU", 3, []byte{0xca, 0xfe})...)
	data = append(data, note("Go", 4, []byte("abc/def"))...)
	gnu, goID := ParseNotes(data, binary.LittleEndian)
	if gnu != "cafe" || goID != "abc/def" {
		t.Errorf("got gnu %q go %q", gnu, goID)
	}
	// A size running past the end stops the walk instead of reading out of bounds.
	bad := binary.LittleEndian.AppendUint32(nil, 4)
	bad = binary.LittleEndian.AppendUint32(bad, 1<<31)
	bad = binary.LittleEndian.AppendUint32(bad, 3)
	bad = append(bad, "GNU\x00"...)
	if gnu, _ := ParseNotes(bad, binary.LittleEndian); gnu != "" {
		t.Errorf("truncated note gave build id %q", gnu)
	}
}

func FuzzParseNotes(f *testing.F) {
	f.Add(note("GNU", 3, []byte{1, 2, 3, 4}))
	f.Add(append(note("Go", 4, []byte("x/y")), note("GNU", 3, []byte{9})...))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 3, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		gnu, goID := ParseNotes(data, binary.LittleEndian)
		if len(gnu) > 2*len(data) || len(goID) > len(data) {
			t.Fatalf("ids longer than their input: %q %q from %d bytes", gnu, goID, len(data))
		}
	})
}
