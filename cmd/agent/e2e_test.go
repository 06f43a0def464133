package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// The workloads: known call chains, built by the tests with gcc.
const (
	chainC = `#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define KEEP __attribute__((noinline))
static volatile unsigned long acc;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
KEEP void c(void){for(int i=0;i<1000000;i++) acc=acc*31+i;}
KEEP void b(void){c(); acc^=2;}
KEEP void a(void){b(); acc^=1;}
int main(int argc,char**argv){double end=now()+atof(argv[1]); while(now()<end) a(); return 0;}
`
	writerC = `#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){double end=now()+atof(argv[1]); int p[2]; static char buf[65536];
 if(pipe(p)) return 1;
 while(now()<end){ if(write(p[1],buf,sizeof buf)<0||read(p[0],buf,sizeof buf)<0) return 1; } return 0;}
`
)

var (
	buildOnce sync.Once
	sondeBin  string
	buildErr  error
)

// sonde builds the agent once per test binary, in a directory every user can read.
func sonde(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sonde-e2e-")
		if err != nil {
			buildErr = err
			return
		}
		os.Chmod(dir, 0o755)
		sondeBin = filepath.Join(dir, "sonde")
		out, err := exec.Command("go", "build", "-o", sondeBin, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return sondeBin
}

func buildWorkload(t testing.TB, name, src string, flags ...string) string {
	t.Helper()
	gcc := testenv.RequireTool(t, "gcc")
	dir := t.TempDir()
	srcPath := filepath.Join(dir, name+".c")
	if err := os.WriteFile(srcPath, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, name)
	args := append([]string{"-o", bin, srcPath}, flags...)
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
}

// startWorkload runs bin for secs seconds and returns its process.
func startWorkload(t testing.TB, bin string, secs float64) *exec.Cmd {
	t.Helper()
	// sonde is built first: the workload's seconds must not run out during the build.
	sonde(t)
	cmd := exec.Command(bin, strconv.FormatFloat(secs, 'f', -1, 64))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// benchSpan is how long a benchmark measures: long for its figures (make bench), short in
// the run CI makes of every benchmark with -short, which checks that each still works.
func benchSpan(long, short time.Duration) time.Duration {
	if testing.Short() {
		return short
	}
	return long
}

// bpfStats profiles pid for 4 s (1 s with -short) with the kernel's statistics on (args add
// flags) and returns its cost per sample (bpf_stats), and sonde's stderr for more of the
// summary.
func bpfStats(b *testing.B, pid int, args ...string) (nsPerSample float64, stderr string) {
	b.Helper()
	_, stderr, err := runSonde(b, append([]string{"--pid", strconv.Itoa(pid), "--duration", benchSpan(4*time.Second, time.Second).String(),
		"--bpf-stats", "--top", "0"}, args...)...)
	if err != nil {
		b.Fatalf("sonde: %v\n%s", err, stderr)
	}
	return float64(summaryCount(b, stderr, "kernel.bpf_ns_per_sample")), stderr
}

// runSonde runs the agent and returns its stdout and stderr.
func runSonde(t testing.TB, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(sonde(t), args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// runSondeUntil runs the agent until it has recorded samples samples of its targets.
func runSondeUntil(t testing.TB, samples uint64, args ...string) testenv.SondeRun {
	t.Helper()
	return testenv.RunSondeUntil(t, sonde(t), samples, args...)
}

func readProfile(t testing.TB, path string) *profile.Profile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return p
}

// names lists a sample's function names, leaf first, inlined frames included.
func names(s *profile.Sample) []string {
	var out []string
	for _, l := range s.Location {
		for _, line := range l.Line {
			out = append(out, line.Function.Name)
		}
	}
	return out
}

// containsInOrder reports whether want appears in names as a subsequence, leaf first.
func containsInOrder(names, want []string) bool {
	i := 0
	for _, n := range names {
		if i < len(want) && n == want[i] {
			i++
		}
	}
	return i == len(want)
}

func TestEndToEndFramePointerChain(t *testing.T) {
	testenv.RequireRoot(t)
	// At -O1 and above gcc 12 gives a leaf that needs no stack no frame, whatever
	// -fno-omit-frame-pointer says, and a frame-pointer walk then skips the leaf's caller.
	// -O0 keeps a frame in every function; unwinding without frames is the .eh_frame stage's job.
	bin := buildWorkload(t, "chain", chainC, "-O0", "-g", "-fno-omit-frame-pointer")
	w := startWorkload(t, bin, 120)
	testenv.WaitCPU(t, w.Process.Pid, 50*time.Millisecond)
	out := filepath.Join(t.TempDir(), "chain.pb.gz")
	// 300 samples: a share of 0.9 is then known to within ±0.035 (two standard errors).
	r := runSondeUntil(t, 300, "--pid", strconv.Itoa(w.Process.Pid), "--output", out)
	stdout, stderr, err := r.Stdout, r.Stderr, r.Err
	if err != nil {
		t.Fatalf("sonde: %v\n%s", err, stderr)
	}
	p := readProfile(t, out)
	var total, chained int64
	for _, s := range p.Sample {
		if pid := s.NumLabel["pid"]; len(pid) != 1 || pid[0] != int64(w.Process.Pid) {
			t.Fatalf("sample of pid %v in a --pid %d profile", pid, w.Process.Pid)
		}
		if s.Label["process_name"][0] != "chain" || len(s.NumLabel["tid"]) != 1 || s.Label["thread_name"][0] == "" {
			t.Fatalf("labels %v %v", s.Label, s.NumLabel)
		}
		total += s.Value[0]
		if containsInOrder(names(s), []string{"c", "b", "a", "main"}) {
			chained += s.Value[0]
		}
	}
	if total < 300 {
		t.Fatalf("%d samples in the profile, where sonde counted at least 300", total)
	}
	if share := float64(chained) / float64(total); share < 0.9 {
		t.Errorf("c<-b<-a<-main in %.3f of %d samples, want at least 0.90", share, total)
	}
	for _, m := range p.Mapping {
		if m.File == bin && m.BuildID == "" {
			t.Errorf("workload mapping without build id: %+v", m)
		}
	}
	if !strings.Contains(stdout, "self%") || !regexp.MustCompile(`\d+\.\d\d%\s+\d+\.\d\d%\s+c\n`).MatchString(stdout) {
		t.Errorf("top table does not lead with c:\n%s", stdout)
	}
	t.Logf("%d samples, chain share %.3f", total, float64(chained)/float64(total))
}

func TestEndToEndKernelFrames(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "writer", writerC, "-O2", "-g")
	w := startWorkload(t, bin, 120)
	testenv.WaitCPU(t, w.Process.Pid, 50*time.Millisecond)
	out := filepath.Join(t.TempDir(), "writer.pb.gz")
	// 200 samples tell a share of half from one of a third with room to spare.
	if r := runSondeUntil(t, 200, "--pid", strconv.Itoa(w.Process.Pid), "--output", out, "--top", "0"); r.Err != nil {
		t.Fatalf("sonde: %v\n%s", r.Err, r.Stderr)
	}
	p := readProfile(t, out)
	var total, namedKernel, writeSyscall int64
	for _, s := range p.Sample {
		total += s.Value[0]
		kernelNames := 0
		sawWrite := false
		for _, l := range s.Location {
			if l.Mapping == nil || l.Mapping.File != "[kernel.kallsyms]" {
				continue
			}
			for _, line := range l.Line {
				kernelNames++
				sawWrite = sawWrite || strings.Contains(line.Function.Name, "write")
			}
		}
		if kernelNames > 0 {
			namedKernel += s.Value[0]
		}
		if sawWrite {
			writeSyscall += s.Value[0]
		}
	}
	if share := float64(namedKernel) / float64(total); share < 0.5 {
		t.Errorf("named kernel frames in %.3f of %d samples, want at least half", share, total)
	}
	if writeSyscall == 0 {
		t.Error("no sample passes a kernel function named *write*")
	}
}

func TestEndToEndTargetExitsMidRun(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "chain", chainC, "-O2", "-fno-omit-frame-pointer")
	w := startWorkload(t, bin, 1.5)
	testenv.WaitCPU(t, w.Process.Pid, 20*time.Millisecond)
	out := filepath.Join(t.TempDir(), "short.pb.gz")
	began := time.Now()
	_, stderr, err := runSonde(t, "--pid", strconv.Itoa(w.Process.Pid), "--duration", "20s", "--output", out, "--top", "0")
	if err != nil {
		t.Fatalf("sonde: %v\n%s", err, stderr)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("sonde ran %v after its only target exited", took)
	}
	p := readProfile(t, out)
	if len(p.Sample) == 0 {
		t.Fatal("no samples from a process that ran 1.5 s")
	}
	if !strings.Contains(stderr, "every target process exited") {
		t.Errorf("no word about the exit:\n%s", stderr)
	}
}

func TestEndToEndHostWide(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "chain", chainC, "-O2", "-fno-omit-frame-pointer")
	w := startWorkload(t, bin, 120)
	testenv.WaitCPU(t, w.Process.Pid, 50*time.Millisecond)
	out := filepath.Join(t.TempDir(), "host.pb.gz")
	// The workload takes most of a core: of 200 samples host-wide, dozens are its.
	if r := runSondeUntil(t, 200, "--frequency", "49", "--output", out, "--top", "0"); r.Err != nil {
		t.Fatalf("sonde: %v\n%s", r.Err, r.Stderr)
	}
	pids := map[int64]bool{}
	for _, s := range readProfile(t, out).Sample {
		pids[s.NumLabel["pid"][0]] = true
	}
	if !pids[int64(w.Process.Pid)] {
		t.Errorf("host-wide profile misses the busy workload %d; has %v", w.Process.Pid, pids)
	}
}

// Mistakes in how sonde is called must be caught before anything is loaded, with exit 2.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--no-such-flag"}, "flag provided but not defined"},
		{[]string{"--frequency", "0"}, "--frequency 0"},
		{[]string{"--frequency", "-5"}, "--frequency -5"},
		{[]string{"--frequency", "abc"}, "invalid value"},
		{[]string{"--pid", "x"}, `"x" is not a process ID`},
		{[]string{"--pid", "999999999"}, "--pid 999999999: no such process"},
		{[]string{"--output", "/no/such/dir/p.pb.gz"}, "cannot write there"},
		{[]string{"--output", "profile.json"}, "unknown format"},
		{[]string{"--output", os.TempDir() + "/"}, "unknown format"},
		{[]string{"extra"}, "unexpected argument"},
	} {
		_, stderr, err := runSonde(t, tc.args...)
		var exit *exec.ExitError
		if !errAs(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("sonde %v: %v, want exit status 2\n%s", tc.args, err, stderr)
			continue
		}
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("sonde %v said %q, want it to mention %q", tc.args, stderr, tc.want)
		}
	}
}

// Without privileges sonde says in one sentence what is missing and how to get it.
func TestUnprivilegedExplainsWhatIsMissing(t *testing.T) {
	testenv.RequireRoot(t) // root is needed to drop to another user
	cmd := exec.Command(sonde(t), "--duration", "1s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errAs(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("unprivileged sonde: %v, want exit status 1\n%s", err, out)
	}
	if !strings.Contains(string(out), "sonde needs root") || !strings.Contains(string(out), "sudo") {
		t.Errorf("unprivileged sonde said:\n%s", out)
	}
	if n := strings.Count(strings.TrimSpace(string(out)), "\n"); n > 0 {
		t.Errorf("want one line, got %d:\n%s", n+1, out)
	}
}

// cpuTime reads a process's user+system CPU time from /proc/PID/stat.
func cpuTime(b *testing.B, pid int) time.Duration {
	d, err := testenv.ProcessCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// An idle target still gets a valid, empty profile covering the run, not an error.
func TestEndToEndIdleTarget(t *testing.T) {
	testenv.RequireRoot(t)
	idle := exec.Command("sleep", "30")
	if err := idle.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { idle.Process.Kill(); idle.Wait() }()
	out := filepath.Join(t.TempDir(), "idle.pb.gz")
	_, stderr, err := runSonde(t, "--pid", strconv.Itoa(idle.Process.Pid), "--duration", "1s", "--output", out)
	if err != nil {
		t.Fatalf("sonde on an idle process: %v\n%s", err, stderr)
	}
	p := readProfile(t, out)
	if len(p.Sample) != 0 || p.DurationNanos < 9e8 || p.Period == 0 {
		t.Errorf("idle profile: %d samples over %d ns, period %d", len(p.Sample), p.DurationNanos, p.Period)
	}
	if !strings.Contains(stderr, "no samples were collected") {
		t.Errorf("no word about the empty profile:\n%s", stderr)
	}
}
