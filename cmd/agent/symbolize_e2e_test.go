package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// goSplit spends three times as long in main.heavy as in main.light: the two loops
// are the same code and heavy runs three times the iterations per round.
const goSplit = `package main

import (
	"os"
	"strconv"
	"time"
)

var sink uint64

//go:noinline
func heavy(n int) uint64 {
	x := sink
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + uint64(i)
	}
	return x
}

//go:noinline
func light(n int) uint64 {
	x := sink
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + uint64(i)
	}
	return x
}

func main() {
	secs, _ := strconv.ParseFloat(os.Args[1], 64)
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	for time.Now().Before(end) {
		sink += heavy(3_000_000)
		sink += light(1_000_000)
	}
}
`

// buildGoWorkload builds src as a static Go binary with the given go build flags.
func buildGoWorkload(t testing.TB, name, src string, flags ...string) string {
	t.Helper()
	goTool := testenv.RequireTool(t, "go")
	dir := t.TempDir()
	for file, content := range map[string]string{"main.go": src, "go.mod": "module example.com/" + name + "\n\ngo 1.22\n"} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, name)
	cmd := exec.Command(goTool, append(append([]string{"build", "-o", bin}, flags...), ".")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// leafShares profiles pid at 999 Hz until it has 4000 samples and returns the share of
// samples whose innermost frame is each of fns ("" for an unnamed one), and the number of
// samples. With 4000, a share of 0.75 has a standard error of 0.007: the 3-point windows
// the tests allow are four of them.
func leafShares(t *testing.T, pid int, fns ...string) (map[string]float64, int64) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "x.pb.gz")
	if r := runSondeUntil(t, 4000, "--pid", strconv.Itoa(pid), "--frequency", "999",
		"--output", out, "--top", "0"); r.Err != nil {
		t.Fatalf("sonde: %v\n%s", r.Err, r.Stderr)
	}
	p := readProfile(t, out)
	counts := map[string]int64{}
	var total int64
	for _, s := range p.Sample {
		total += s.Value[0]
		// The innermost user frame: kernel frames, if any, come first.
		for _, l := range s.Location {
			if l.Mapping != nil && l.Mapping.File == "[kernel.kallsyms]" {
				continue
			}
			name := "" // unnamed
			if len(l.Line) > 0 {
				name = l.Line[0].Function.Name
			}
			counts[name] += s.Value[0]
			break
		}
	}
	shares := map[string]float64{}
	for _, fn := range fns {
		shares[fn] = float64(counts[fn]) / float64(max(total, 1))
	}
	if total < 4000 {
		t.Fatalf("%d samples in the profile, where sonde counted at least 4000; counts %v", total, counts)
	}
	return shares, total
}

// A stripped Go binary is named from its pclntab: a 3:1 split of CPU time between two
// functions reads as 75 % and 25 % by their Go names, within 3 points.
func TestEndToEndGoFunctionShares(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildGoWorkload(t, "split", goSplit, "-ldflags=-s -w")
	w := startWorkload(t, bin, 120)
	testenv.WaitCPU(t, w.Process.Pid, 100*time.Millisecond)
	shares, total := leafShares(t, w.Process.Pid, "main.heavy", "main.light", "")
	heavy, light := shares["main.heavy"], shares["main.light"]
	// The rest is the runtime's own threads (sysmon's sleeps, the collector): it must be
	// named too.
	if heavy+light < 0.8 || shares[""] > 0.01 {
		t.Fatalf("main.heavy %.3f and main.light %.3f of %d samples, %.3f unnamed", heavy, light, total, shares[""])
	}
	if got := heavy / (heavy + light); got < 0.72 || got > 0.78 {
		t.Errorf("main.heavy has %.1f %% of heavy+light, want 75 ± 3 (%d samples)", 100*got, total)
	}
	t.Logf("main.heavy %.3f, main.light %.3f of %d samples", heavy, light, total)
}

const (
	spinLib = `
static volatile unsigned long acc;
void exported_spin(void) { for (int i = 0; i < 1000000; i++) acc = acc * 31 + i; }
`
	spinMain = `#include <stdlib.h>
#include <time.h>
void exported_spin(void);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){double end=now()+atof(argv[1]); while(now()<end) exported_spin(); return 0;}
`
)

// A stripped library still names its exported functions from .dynsym.
func TestEndToEndStrippedDynsym(t *testing.T) {
	testenv.RequireRoot(t)
	strip := testenv.RequireTool(t, "strip")
	readelf := testenv.RequireTool(t, "readelf")
	lib := buildWorkload(t, "libspin.so", spinLib, "-O2", "-shared", "-fPIC")
	bin := buildWorkload(t, "spinner", spinMain, "-O2", "-L"+filepath.Dir(lib), "-lspin", "-Wl,-rpath,"+filepath.Dir(lib))
	for _, f := range []string{lib, bin} {
		if out, err := exec.Command(strip, "-s", f).CombinedOutput(); err != nil {
			t.Fatalf("strip -s %s: %v\n%s", f, err, out)
		}
		if out, _ := exec.Command(readelf, "-S", f).Output(); strings.Contains(string(out), ".symtab") {
			t.Fatalf("%s keeps .symtab after strip -s", f)
		}
	}
	w := startWorkload(t, bin, 120)
	testenv.WaitCPU(t, w.Process.Pid, 50*time.Millisecond)
	shares, total := leafShares(t, w.Process.Pid, "exported_spin")
	if shares["exported_spin"] < 0.8 {
		t.Errorf("exported_spin is the innermost frame of %.3f of %d samples, want nearly all", shares["exported_spin"], total)
	}
}
