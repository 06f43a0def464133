package main

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/reporter/otlp"
)

// mapperC maps a file executable, as a loader maps a library, and spins in its own code so
// that sonde samples it and reads its mappings. With a third argument it exits after that
// many seconds.
const mapperC = `#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static volatile unsigned long acc;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
__attribute__((noinline)) void mapper_spin(void){for(int i=0;i<100000;i++) acc=acc*31+i;}
int main(int argc,char**argv){
 int fd=open(argv[1],O_RDONLY); if(fd<0){perror(argv[1]);return 1;}
 if(mmap(0,4096,PROT_READ|PROT_EXEC,MAP_PRIVATE,fd,0)==MAP_FAILED){perror("mmap");return 1;}
 close(fd); printf("mapped\n"); fflush(stdout);
 double end=now()+atof(argv[2]); while(now()<end) mapper_spin(); return 0;}
`

// startMapper runs the mapper on path for secs seconds and waits until it has mapped it.
func startMapper(t *testing.T, bin, path string, secs float64) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, path, strconv.FormatFloat(secs, 'f', -1, 64))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	buf := make([]byte, 7)
	if _, err := out.Read(buf); err != nil || string(buf[:6]) != "mapped" {
		t.Fatalf("mapper on %s: %q, %v", path, buf, err)
	}
	return cmd
}

// limitedCaps runs sonde as root but without CAP_SYS_ADMIN and CAP_CHECKPOINT_RESTORE, as
// deploy/ does: /proc/PID/map_files is then closed, and files are opened by their path
// inside the process's root, where a hostile process controls what is found.
func limitedCaps(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	setpriv := testenv.RequireTool(t, "setpriv")
	return exec.Command(setpriv, append([]string{"--bounding-set=-all,+bpf,+perfmon,+sys_ptrace,+dac_read_search,+syslog", "--", sonde(t)}, args...)...)
}

// summaryCount reads one counter of sonde's summary line.
func summaryCount(t testing.TB, stderr, key string) int64 {
	t.Helper()
	m := regexp.MustCompile(`\b` + regexp.QuoteMeta(key) + `=(\d+)`).FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("no %s in the summary:\n%s", key, stderr)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// Whatever a process leaves where its mapped file was (a FIFO no one writes, a device, a
// socket, a directory), and whatever it maps (a 10 GB sparse file, garbage, a file that
// shrinks and grows while sonde reads it), sonde skips it, counts it, keeps sampling, and
// stops on time.
func TestHostileFiles(t *testing.T) {
	testenv.RequireRoot(t)
	mapper := buildWorkload(t, "mapper", mapperC, "-O1")
	good := buildWorkload(t, "libgood", "int good(int x){return x+1;}\n", "-O2", "-shared", "-fPIC")
	dir := t.TempDir()
	copyTo := func(name string) string {
		p := filepath.Join(dir, name)
		data, err := os.ReadFile(good)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const secs = 60
	// Mapped, then replaced while the process runs: the maps line then names the path
	// "(deleted)", and the path inside the root reaches the replacement.
	replace := map[string]func(p string) error{
		"fifo": func(p string) error { return syscall.Mkfifo(p, 0o644) },
		"device": func(p string) error {
			return syscall.Mknod(p, syscall.S_IFCHR|0o644, 1<<8|3) // what /dev/null is
		},
		"socket": func(p string) error {
			l, err := net.Listen("unix", p)
			if err == nil {
				t.Cleanup(func() { l.Close() })
			}
			return err
		},
		"directory": func(p string) error { return os.Mkdir(p, 0o755) },
	}
	for kind, put := range replace {
		p := copyTo("lib" + kind + ".so")
		startMapper(t, mapper, p, secs)
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := put(p); err != nil {
			t.Fatalf("put a %s at %s: %v", kind, p, err)
		}
	}
	// A 10 GB sparse file, mapped executable.
	sparse := filepath.Join(dir, "sparse.so")
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(10 << 30); err != nil {
		testenv.Unavailable(t, "no sparse files in %s: %v", dir, err)
	}
	f.Close()
	startMapper(t, mapper, sparse, secs)
	// Garbage where an ELF header should be.
	garbage := filepath.Join(dir, "garbage.so")
	os.WriteFile(garbage, bytes.Repeat([]byte("\x7fELF\xff\xff"), 4096), 0o755)
	startMapper(t, mapper, garbage, secs)
	// A file truncated and rewritten over and over while it is mapped and read.
	churning := copyTo("libchurn.so")
	startMapper(t, mapper, churning, secs)
	stopChurn := make(chan struct{})
	churned := make(chan struct{})
	go func() {
		defer close(churned)
		data, _ := os.ReadFile(good)
		for i := 0; ; i++ {
			select {
			case <-stopChurn:
				return
			default:
			}
			os.WriteFile(churning, data[:len(data)*(i%4)/4], 0o755)
		}
	}()
	defer func() { close(stopChurn); <-churned }()

	out := filepath.Join(t.TempDir(), "host.pb.gz")
	cmd := limitedCaps(t, "--duration", "4s", "--frequency", "99", "--output", out, "--top", "0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	began := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("sonde: %v\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("sonde still running %v after a 4 s run among hostile files:\n%s", time.Since(began), stderr.String())
	}
	took := time.Since(began)
	log := stderr.String()
	if n := summaryCount(t, log, "processes.files_not_regular"); n < 4 {
		t.Errorf("%d files refused for not being regular files, want the FIFO, device, socket and directory", n)
	}
	if n := summaryCount(t, log, "processes.files_too_large"); n < 1 {
		t.Errorf("the 10 GB sparse file was not refused as too large")
	}
	if n := summaryCount(t, log, "processes.files_unidentified"); n < 6 {
		t.Errorf("%d files unidentified, want at least the six hostile ones", n)
	}
	if n := summaryCount(t, log, "kernel.samples"); n < 100 {
		t.Errorf("%d samples: sampling did not go on", n)
	}
	if _, err := os.Stat(out); err != nil {
		t.Errorf("no profile written: %v", err)
	}
	t.Logf("4 s run took %v", took.Round(time.Millisecond))
}

// A process whose library is replaced by a FIFO and which then exits is named at the
// last flush through the host path: that must not block the flush or the exit.
func TestFIFOAfterExitDoesNotStallShutdown(t *testing.T) {
	testenv.RequireRoot(t)
	mapper := buildWorkload(t, "mapper", mapperC, "-O1")
	lib := filepath.Join(t.TempDir(), "libswap.so")
	good := buildWorkload(t, "libgood", "int good(int x){return x+1;}\n", "-O2", "-shared", "-fPIC")
	data, _ := os.ReadFile(good)
	os.WriteFile(lib, data, 0o755)
	proc := startMapper(t, mapper, lib, 1.5)
	out := filepath.Join(t.TempDir(), "p.pb.gz")
	cmd := exec.Command(sonde(t), "--pid", strconv.Itoa(proc.Process.Pid), "--duration", "30s", "--output", out, "--top", "0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Swap the library for a FIFO while the process still runs; it then exits and sonde,
	// which stops when its only target exits, names its frames.
	time.Sleep(500 * time.Millisecond)
	os.Remove(lib)
	if err := syscall.Mkfifo(lib, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("sonde: %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("sonde stalled after its target exited with a FIFO at its library's path:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "every target process exited") {
		t.Errorf("sonde did not stop with its target:\n%s", stderr.String())
	}
}

// oddNamesC gives its thread a name that is not UTF-8 and holds a terminal escape, and
// spins in a function whose symbol is not UTF-8 either, in a library whose file name is
// not: the three ways a process hands sonde bytes it did not choose.
const oddNamesC = `#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
int main(int argc,char**argv){
 prctl(PR_SET_NAME,"\xff\xfe\x1b[31modd",0,0,0);
 void*h=dlopen(argv[1],RTLD_NOW); if(!h){fprintf(stderr,"%s\n",dlerror());return 1;}
 void(*f)(double)=(void(*)(double))dlsym(h,"spin\xff"); if(!f) return 1;
 printf("mapped\n"); fflush(stdout); f(atof(argv[2])); return 0;}
`

const oddLibC = `#include <time.h>
static volatile unsigned long acc;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
void spin(double secs) __asm__("spin\xff");
void spin(double secs){double end=now()+secs; while(now()<end) for(int i=0;i<100000;i++) acc=acc*31+i;}
`

// One process's odd names must not cost anyone's profile: every output is written and
// reads back, with the invalid bytes replaced.
func TestInvalidUTF8Names(t *testing.T) {
	testenv.RequireRoot(t)
	lib := buildWorkload(t, "libodd", oddLibC, "-O1", "-shared", "-fPIC")
	oddPath := filepath.Join(t.TempDir(), "lib\xffodd.so")
	data, _ := os.ReadFile(lib)
	os.WriteFile(oddPath, data, 0o755)
	prog := buildWorkload(t, "odd", oddNamesC, "-O1", "-ldl")
	startMapper(t, prog, oddPath, 30)
	dir := t.TempDir()
	js, pb, pp := filepath.Join(dir, "p.otlp.json"), filepath.Join(dir, "p.otlp.pb"), filepath.Join(dir, "p.pb.gz")
	stdout, stderr, err := runSonde(t, "--duration", "3s", "--frequency", "99", "--output", js, "--output", pb, "--output", pp)
	if err != nil {
		t.Fatalf("sonde: %v\n%s", err, stderr)
	}
	raw, err := os.ReadFile(js)
	if err != nil || !json.Valid(bytes.TrimSpace(raw)) {
		t.Fatalf("OTLP/JSON output: %v, valid %v", err, json.Valid(bytes.TrimSpace(raw)))
	}
	for _, p := range []string{js, pb} {
		profiles, err := otlp.ReadFile(p)
		if err != nil {
			t.Fatalf("read back %s: %v", p, err)
		}
		found := false
		for _, prof := range profiles {
			for _, s := range prof.Samples {
				// A run of invalid bytes becomes one U+FFFD.
				found = found || (strings.Contains(s.ThreadName, "\uFFFD") && strings.HasSuffix(s.ThreadName, "odd"))
			}
		}
		if !found {
			t.Errorf("%s: no sample of the thread with the odd name, its bytes replaced", p)
		}
	}
	readProfile(t, pp)
	if strings.Contains(stdout, "\x1b[31m") || strings.Contains(stderr, "\x1b[31m") {
		t.Error("a terminal escape from a thread name reached the terminal raw")
	}
}

// reexecC spins for a few milliseconds in its own code, then execs itself again, argv[1]
// times: each image lives too briefly for maps read at leisure.
const reexecC = `#include <stdlib.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
static volatile unsigned long acc;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
__attribute__((noinline)) void reexec_spin(double until){while(now()<until) for(int i=0;i<1000;i++) acc=acc*31+i;}
int main(int argc,char**argv){
 int left=atoi(argv[1]); reexec_spin(now()+0.005);
 if(left<=0) return 0;
 char n[16]; snprintf(n,sizeof n,"%d",left-1);
 execl("/proc/self/exe",argv[0],n,(char*)0); return 1;}
`

// A process that re-execs every few milliseconds has its mappings read at each exec, while
// the image still runs, so its samples resolve to its functions, not to addresses.
func TestShortLivedImagesResolve(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "reexec", reexecC, "-O1")
	// sonde is built before the workload starts: its 3 s must not run out during a build.
	sonde(t)
	cmd := exec.Command(bin, "600") // about 3 s of 5 ms images
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out := filepath.Join(t.TempDir(), "reexec.pb.gz")
	_, stderr, err := runSonde(t, "--pid", strconv.Itoa(cmd.Process.Pid), "--frequency", "999", "--duration", "10s", "--output", out, "--top", "0")
	if err != nil {
		t.Fatalf("sonde: %v\n%s", err, stderr)
	}
	// Samples taken before an image's maps reached the kernel name their leaf's mapping, so
	// that an image gone before it is read (the reader waits behind a busy CPU) resolves.
	if summaryCount(t, stderr, "processes.kernel_mappings") == 0 {
		t.Errorf("no mapping was learnt from the kernel for the first samples of 600 images")
	}
	// Each image spends some of its life in the loader and the kernel's exec: those
	// samples are named too, after ld.so and libc's start-up. What must not happen is a
	// frame no mapping covers.
	var total, named, unresolved, leafUnresolved int64
	for _, s := range readProfile(t, out).Sample {
		if inExec(s) {
			// Taken in the kernel's execve after it switched to the new image: the user
			// registers are still the old image's, and no reading can name them.
			continue
		}
		total += s.Value[0]
		for _, n := range names(s) {
			if n == "reexec_spin" {
				named += s.Value[0]
				break
			}
		}
		for i, l := range s.Location {
			if l.Mapping == nil {
				unresolved += s.Value[0]
				if i == 0 {
					leafUnresolved += s.Value[0]
				}
				break
			}
		}
	}
	if total < 500 {
		t.Fatalf("%d samples of a process busy for 3 s at 999 Hz", total)
	}
	// The code a sample ran is named: the reading at the exec holds the program and its
	// loader, and the libraries follow within a millisecond or so.
	if share := float64(leafUnresolved) / float64(total); share > 0.05 {
		t.Errorf("%.3f of %d samples ran code no mapping covers, want at most 0.05", share, total)
	}
	// Until the loader has mapped the libraries and they are read (about the first
	// millisecond of each 5 ms image), frames below main cannot be walked with tables.
	if share := float64(unresolved) / float64(total); share > 0.20 {
		t.Errorf("%.3f of %d samples hold a frame no mapping covers, want at most 0.20", share, total)
	}
	if share := float64(named) / float64(total); share < 0.6 {
		t.Errorf("reexec_spin names %.3f of %d samples, want at least 0.60 (the rest is exec and the loader)", share, total)
	}
	t.Logf("reexec_spin in %d, unresolved leaf in %d, unresolved frames in %d of %d samples", named, leafUnresolved, unresolved, total)
}

// inExec reports whether a sample was taken inside the kernel's execve.
func inExec(s *profile.Sample) bool {
	for _, n := range names(s) {
		if strings.Contains(n, "execve") {
			return true
		}
	}
	return false
}

// Output files: a directory where a file is asked for is a usage error before anything
// is sampled; files get the mode the umask gives, replace what was there atomically,
// appear when sonde is interrupted too, and no temporary file is left behind.
func TestOutputFiles(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	t.Run("directory", func(t *testing.T) {
		asDir := filepath.Join(dir, "already.pb.gz")
		os.Mkdir(asDir, 0o755)
		began := time.Now()
		_, stderr, err := runSonde(t, "--duration", "5s", "--output", asDir)
		var exit *exec.ExitError
		if !errAs(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(stderr, "is a directory") {
			t.Errorf("--output naming a directory: %v\n%s", err, stderr)
		}
		if time.Since(began) > 3*time.Second {
			t.Errorf("the usage error came after %v: sonde sampled first", time.Since(began))
		}
	})
	t.Run("umask-and-replace", func(t *testing.T) {
		out := filepath.Join(dir, "run.pb.gz")
		os.WriteFile(out, []byte("old"), 0o600)
		old := syscall.Umask(0o027)
		_, stderr, err := runSonde(t, "--duration", "1s", "--output", out, "--output", filepath.Join(dir, "run.folded"), "--top", "0")
		syscall.Umask(old)
		if err != nil {
			t.Fatalf("sonde: %v\n%s", err, stderr)
		}
		st, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o640 {
			t.Errorf("output mode %v under umask 027, want -rw-r-----", st.Mode().Perm())
		}
		readProfile(t, out)
	})
	t.Run("interrupted", func(t *testing.T) {
		out := filepath.Join(dir, "int.pb.gz")
		cmd := exec.Command(sonde(t), "--output", out, "--top", "0")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond)
		cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("sonde after Ctrl-C: %v", err)
		}
		readProfile(t, out)
	})
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name() != "already.pb.gz" && e.Name() != "run.pb.gz" && e.Name() != "run.folded" && e.Name() != "int.pb.gz" {
			t.Errorf("left behind in the output directory: %s", e.Name())
		}
	}
}

// Without a capability it cannot run without, sonde names it; without one it can do
// without, it names it and what degrades, and profiles.
func TestMissingCapabilitiesAreNamed(t *testing.T) {
	testenv.RequireRoot(t)
	setpriv := testenv.RequireTool(t, "setpriv")
	out, _ := exec.Command(setpriv, "--bounding-set=-all,+perfmon,+sys_ptrace", "--", sonde(t), "--duration", "1s").CombinedOutput()
	if !strings.Contains(string(out), "missing CAP_BPF") || strings.Count(strings.TrimSpace(string(out)), "\n") > 0 {
		t.Errorf("without CAP_BPF sonde said:\n%s", out)
	}
	cmd := exec.Command(setpriv, "--bounding-set=-all,+bpf,+perfmon,+sys_ptrace,+dac_read_search", "--", sonde(t), "--duration", "1s", "--top", "0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sonde without CAP_SYSLOG: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "missing CAP_SYSLOG: kernel frames keep addresses only") {
		t.Errorf("without CAP_SYSLOG sonde did not say what degrades:\n%s", out)
	}
}
