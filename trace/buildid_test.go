package trace

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

const helloC = `#include <stdio.h>
__attribute__((noinline)) int work(int n){int s=0;for(int i=0;i<n;i++)s+=i*i;return s;}
int main(int argc,char**argv){printf("%d\n",work(argc*1000));return 0;}
`

// buildC compiles src with gcc and extra flags into dir.
func buildC(t *testing.T, dir, name, src string, flags ...string) string {
	t.Helper()
	gcc := testenv.RequireTool(t, "gcc")
	srcPath := filepath.Join(dir, name+".c")
	if err := os.WriteFile(srcPath, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	args := append([]string{"-O1", "-o", out, srcPath}, flags...)
	if b, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %v: %v\n%s", args, err, b)
	}
	return out
}

func identityOf(t *testing.T, path string) fileIdentity {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	id, err := readIdentity(f, st.Size())
	if err != nil {
		t.Fatalf("readIdentity(%s): %v", path, err)
	}
	return id
}

func TestGNUBuildIDMatchesReadelf(t *testing.T) {
	readelf := testenv.RequireTool(t, "readelf")
	bin := buildC(t, t.TempDir(), "hello", helloC, "-Wl,--build-id=sha1")
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
	dir := t.TempDir()
	a := buildC(t, dir, "a", helloC, "-Wl,--build-id=none")
	b := buildC(t, dir, "b", strings.Replace(helloC, "1000", "2000", 1), "-Wl,--build-id=none")
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
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\nfunc main(){}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module hello\n"), 0o644)
	bin := filepath.Join(dir, "hello")
	cmd := exec.Command(goTool, "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
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
	bin := buildC(t, t.TempDir(), "hello", helloC)
	data, _ := os.ReadFile(bin)
	for _, cut := range []int{0, 16, 64, len(data) / 3} {
		p := filepath.Join(t.TempDir(), "cut")
		os.WriteFile(p, data[:cut], 0o644)
		f, _ := os.Open(p)
		_, err := readIdentity(f, int64(cut))
		f.Close()
		if cut < 64 && err == nil {
			t.Errorf("truncated to %d bytes: no error", cut)
		}
	}
}

func TestKernelBuildID(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/notes"); err != nil {
		t.Skip("no /sys/kernel/notes")
	}
	m, err := KernelMapping("/sys/kernel/notes")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(m.File.GNUBuildID) {
		t.Errorf("kernel build id %q", m.File.GNUBuildID)
	}
	if m.Path != KernelPath {
		t.Errorf("kernel mapping path %q", m.Path)
	}
}
