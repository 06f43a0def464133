package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// familyC forks: the parent spins in parent_spin, the child in child_spin, for argv[1]
// seconds of CPU each (so a loaded host does not starve the profile); the parent then
// exits with status 7.
const familyC = `#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
#define KEEP __attribute__((noinline))
static volatile unsigned long acc;
static double now(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec/1e9;}
KEEP void parent_spin(double s){double end=now()+s; while(now()<end) for(int i=0;i<10000;i++) acc=acc*31+i;}
KEEP void child_spin(double s){double end=now()+s; while(now()<end) for(int i=0;i<10000;i++) acc=acc*17+i;}
int main(int argc,char**argv){double s=atof(argv[1]); pid_t c=fork(); if(c==0){child_spin(s); _exit(0);} parent_spin(s); int st; waitpid(c,&st,0); return 7;}
`

// runRecord runs sonde record in dir and returns its exit status and output.
func runRecord(t *testing.T, dir string, args ...string) (status int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(sonde(t), append([]string{"record"}, args...)...)
	cmd.Dir = dir
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errAs(err, &exit):
		status = exit.ExitCode()
	default:
		t.Fatalf("sonde record: %v", err)
	}
	return status, o.String(), e.String()
}

// A program and the child it forks are profiled until the program exits; sonde names
// their hot functions and exits with the program's status.
func TestRecordProgramAndChildren(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "family", familyC, "-O1", "-g")
	dir := t.TempDir()
	out := filepath.Join(dir, "family.pb.gz")
	status, stdout, stderr := runRecord(t, dir, "--output", out, "--output", "family.html", "--top", "5", "--", bin, "0.6")
	if status != 7 {
		t.Fatalf("status %d, want the program's 7\n%s", status, stderr)
	}
	if stdout != "" {
		t.Errorf("sonde wrote to the program's standard output: %q", stdout)
	}
	for _, name := range []string{"parent_spin", "child_spin"} {
		if !regexp.MustCompile(`\d+\.\d\d%\s+\d+\.\d\d%\s+` + name + `\n`).MatchString(stderr) {
			t.Errorf("top table lacks %s:\n%s", name, stderr)
		}
	}
	if !strings.Contains(stderr, "flame graph: file://"+filepath.Join(dir, "family.html")+"\n") {
		t.Errorf("no word of where the flame graph is:\n%s", stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "family.html")); err != nil {
		t.Error(err)
	}
	bySpin := map[string]map[int64]int64{"parent_spin": {}, "child_spin": {}}
	pids := map[int64]bool{}
	for _, s := range readProfile(t, out).Sample {
		pid := s.NumLabel["pid"][0]
		pids[pid] = true
		for _, n := range names(s) {
			if m := bySpin[n]; m != nil {
				m[pid] += s.Value[0]
			}
		}
	}
	if len(pids) != 2 || len(bySpin["parent_spin"]) != 1 || len(bySpin["child_spin"]) != 1 {
		t.Fatalf("samples of pids %v; parent_spin by pid %v, child_spin by pid %v: want one process each", pids, bySpin["parent_spin"], bySpin["child_spin"])
	}
	for name, m := range bySpin {
		for pid, n := range m {
			// 0.6 s of CPU at 199 Hz is about 120 samples.
			if n < 60 {
				t.Errorf("%s: %d samples in pid %d", name, n, pid)
			}
			if other := bySpin["parent_spin"]; name == "child_spin" && other[pid] > 0 {
				t.Errorf("the child's pid %d is the parent's", pid)
			}
		}
	}
}

// sonde record's status is the program's: its exit code, 128+N when signal N killed it,
// 127 when it cannot be found; mistakes in calling sonde are 2, before anything runs.
func TestRecordExitStatus(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		args   []string
		status int
		want   string
		root   bool
	}{
		{[]string{"--", "/no/such/program"}, 127, "no such file", false},
		{nil, 2, "no program to run", false},
		{[]string{"--command", "true", "--", "true"}, 2, "not both", false},
		{[]string{"--frequency", "0", "true"}, 2, "--frequency 0", false},
		{[]string{"--output", "x.json", "true"}, 2, "unknown format", false},
		{[]string{"--top", "0", "--command", "exit 3"}, 3, "", true},
		{[]string{"--top", "0", "--", "sh", "-c", "kill -TERM $$"}, 128 + int(syscall.SIGTERM), "", true},
	}
	for _, tc := range cases {
		if tc.root && os.Geteuid() != 0 {
			testenv.Unavailable(t, "needs root for BPF")
			continue
		}
		status, _, stderr := runRecord(t, dir, tc.args...)
		if status != tc.status || !strings.Contains(stderr, tc.want) {
			t.Errorf("sonde record %q: status %d, want %d, saying %q:\n%s", tc.args, status, tc.status, tc.want, stderr)
		}
	}
}

// SIGTERM to sonde goes on to the program; sonde waits for it, writes what it collected
// and exits with the program's status.
func TestRecordForwardsSIGTERM(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "sleep.folded")
	cmd := exec.Command(sonde(t), "record", "--output", out, "--top", "0", "--", "sleep", "60")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	// The program runs once sonde records: its comm, then sleep, shows in /proc.
	deadline := time.Now().Add(20 * time.Second)
	for !childRuns(cmd.Process.Pid, "sleep") {
		if time.Now().After(deadline) {
			t.Fatalf("sleep never started:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errAs(err, &exit) || exit.ExitCode() != 128+int(syscall.SIGTERM) {
		t.Fatalf("sonde record: %v, want exit status 143\n%s", err, stderr.String())
	}
	if _, err := os.Stat(out); err != nil {
		t.Errorf("nothing written: %v", err)
	}
}

// childRuns reports whether a child of pid runs the program named comm.
func childRuns(pid int, comm string) bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: the name may hold spaces and parentheses.
		open, end := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(string(stat[end+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) && string(stat[open+1:end]) == comm {
			return true
		}
	}
	return false
}

// intCounterC counts the SIGINTs it gets in the second after the first, and exits with
// that count.
const intCounterC = `#include <signal.h>
#include <time.h>
#include <unistd.h>
static volatile sig_atomic_t n;
static void on_int(int s){(void)s; n++;}
int main(void){
 struct sigaction sa={0}; sa.sa_handler=on_int; sigaction(SIGINT,&sa,0);
 write(1,"ready\n",6);
 while(!n) pause();
 struct timespec t={1,0}; while(nanosleep(&t,&t)) {}
 return n;}
`

// Ctrl-C on the terminal reaches the program once, from the terminal: sonde, in the same
// foreground process group, does not pass it on a second time; it writes what it
// collected and exits with the program's status.
func TestRecordCtrlCOnTerminal(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "intcount", intCounterC, "-O1")
	dir := t.TempDir()
	cmd := exec.Command(sonde(t), "record", "--output", "int.folded", "--top", "0", "--", bin)
	cmd.Dir = dir
	term := startInTerminal(t, cmd, 24, 80)
	if !term.waitFor("ready", 20*time.Second) {
		t.Fatalf("the program never ran:\n%q", term.output())
	}
	term.typeKeys(t, "\x03")
	term.wait(t, 20*time.Second)
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errAs(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("sonde record: %v, want the program's status 1 (one SIGINT)\n%q", err, term.output())
	}
	if _, err := os.Stat(filepath.Join(dir, "int.folded")); err != nil {
		t.Errorf("nothing written: %v", err)
	}
}
