package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
)

// The long scenarios run for minutes from `make soak` (SONDE_SOAK=1); make test runs them
// for seconds, with the same assertions.
func soak() bool { return os.Getenv("SONDE_SOAK") == "1" }

// agent is a running sonde with its metrics endpoint.
type agent struct {
	cmd    *exec.Cmd
	addr   string
	stderr *lockedBuffer
	done   chan error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startAgent runs sonde with args and a metrics endpoint, and waits until it is healthy.
func startAgent(t testing.TB, args ...string) *agent {
	t.Helper()
	return startAgentEnv(t, nil, args...)
}

// startAgentEnv is startAgent with env added to sonde's environment.
func startAgentEnv(t testing.TB, env []string, args ...string) *agent {
	t.Helper()
	a := &agent{addr: freeAddr(t), stderr: &lockedBuffer{}, done: make(chan error, 1)}
	a.cmd = exec.Command(sonde(t), append([]string{"--metrics-addr", a.addr, "--top", "0"}, args...)...)
	a.cmd.Env = append(os.Environ(), env...)
	a.cmd.Stderr = a.stderr
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.done <- a.cmd.Wait() }()
	t.Cleanup(func() {
		a.cmd.Process.Kill()
		<-a.done
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if code, _ := a.get(t, "/healthz"); code == http.StatusOK {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("sonde not healthy after 20 s:\n%s", a.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (a *agent) get(t testing.TB, path string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + a.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// metrics scrapes /metrics into name{labels} → value.
// waitMetrics waits until cond holds of the agent's metrics, and returns them then.
func (a *agent) waitMetrics(t testing.TB, what string, cond func(m map[string]float64) bool) map[string]float64 {
	t.Helper()
	var m map[string]float64
	testenv.WaitFor(t, what, testenv.SampleTimeout, func() (bool, string) {
		m = a.metrics(t)
		return cond(m), fmt.Sprintf("samples %v, lost %v, processes %v, kernel processes %v", m["sonde_samples_total"],
			m["sonde_samples_lost_total"], m["sonde_processes"], m[`sonde_bpf_map_entries{map="proc_maps"}`])
	})
	return m
}

func (a *agent) metrics(t testing.TB) map[string]float64 {
	t.Helper()
	code, body := a.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// stop interrupts sonde and waits for it to exit.
func (a *agent) stop(t testing.TB) {
	t.Helper()
	a.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-a.done:
		a.done <- err
		if err != nil {
			t.Fatalf("sonde: %v\n%s", err, a.stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("sonde did not stop within a minute of SIGINT")
	}
}

// /healthz answers once sampling runs and /metrics' counters move as samples flow.
func TestMetricsEndpoint(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "chain", chainC, "-O2")
	startWorkload(t, bin, 30)
	a := startAgent(t, "--frequency", "99", "--interval", "1s")
	first := a.metrics(t)
	// The first interval's names take a while (kallsyms, libc's DWARF): wait for them.
	var second map[string]float64
	for deadline := time.Now().Add(60 * time.Second); ; {
		time.Sleep(time.Second)
		second = a.metrics(t)
		if second[`sonde_symbolize_locations_total{outcome="named"}`] > 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, name := range []string{"sonde_samples_total", `sonde_symbolize_locations_total{outcome="named"}`} {
		if second[name] <= first[name] {
			t.Errorf("%s did not move: %v then %v", name, first[name], second[name])
		}
	}
	for _, name := range []string{"go_goroutines", "process_open_fds", "sonde_memory_rss_bytes", `sonde_bpf_map_entries{map="proc_maps"}`, "sonde_processes", `sonde_unwind_walks_total{outcome="complete"}`, `sonde_symbolize_cache_size_bytes{cache="kernel_symbols"}`} {
		if _, ok := second[name]; !ok {
			t.Errorf("no %s in /metrics", name)
		}
	}
	// An interval's end gives the heap back (heapTrimmer).
	a.waitMetrics(t, "the heap given back at an interval's end", func(m map[string]float64) bool {
		return m["sonde_memory_heap_trims_total"] >= 1
	})
	// 99 Hz on up to 40 CPUs is one thread's load: Go's scheduler runs on one.
	if got := second["go_sched_gomaxprocs_threads"]; runtime.NumCPU() <= 40 && os.Getenv("GOMAXPROCS") == "" && got != 1 {
		t.Errorf("GOMAXPROCS %v at 99 Hz on %d CPUs, want 1", got, runtime.NumCPU())
	}
	if code, body := a.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while sampling: %d %s", code, body)
	}
	a.stop(t)
}

// churnC forks and execs a short-lived program at the rate given, for the seconds given.
const churnC = `#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){double rate=atof(argv[1]),end=now()+atof(argv[2]),next=now();
 while(now()<end){ if(now()<next){usleep(200);continue;} next+=1/rate;
  pid_t p=fork(); if(p==0){execl(argv[3],argv[3],(char*)0);_exit(127);} if(p>0) waitpid(p,0,0);}
 return 0;}
`

// stats reads what the churn and overflow tests compare: memory, descriptors,
// goroutines, and the per-process state sonde and the kernel hold.
// stats reads what a leak would raise. heap is the Go heap live at the last collection:
// what a leak grows. RSS is no measure of it: freed heap goes back to the system lazily,
// and sonde's code pages come in as code paths first run; nor is the heap allocated, which
// holds the garbage of the cycle a reading lands in.
func (a *agent) stats(t *testing.T) (heap, fds, goroutines, kernelProcs, tracked float64) {
	m := a.metrics(t)
	return m["go_gc_heap_live_bytes"], m["process_open_fds"], m["go_goroutines"], m[`sonde_bpf_map_entries{map="proc_maps"}`], m["sonde_processes"]
}

// floorHeap is the lowest of first and eleven more readings of the live heap 0.6 s apart,
// three intervals' worth: what an interval's work holds for a moment may be live at one
// collection, while what cannot be collected (a leak) raises the floor. The smoke run of
// the benchmarks (-short) takes three.
func (a *agent) floorHeap(t testing.TB, first float64) float64 {
	low, readings := first, 11
	if testing.Short() {
		readings = 3
	}
	for range readings {
		time.Sleep(600 * time.Millisecond)
		low = min(low, a.metrics(t)["go_gc_heap_live_bytes"])
	}
	return low
}

// churnCgroup makes a cgroup v2 directory for a test's processes, open for
// SysProcAttr.CgroupFD, and removes it when the test ends.
func churnCgroup(t *testing.T) *os.File {
	t.Helper()
	mounts, err := cgroup2Mounts("/proc/self/mountinfo")
	if err != nil || len(mounts) == 0 {
		testenv.Unavailable(t, "needs a cgroup2 mount")
	}
	dir, err := os.MkdirTemp(mounts[0].dir, "sonde-churn-")
	if err != nil {
		testenv.Unavailable(t, "cannot make a cgroup: %v", err)
	}
	f, err := os.Open(dir)
	if err != nil {
		os.Remove(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		// Its processes have exited, but the kernel frees a cgroup's last task a moment later.
		testenv.Wait("the churn's cgroup to be removable", testenv.StartTimeout, func() (bool, string) {
			err := os.Remove(dir)
			return err == nil || os.IsNotExist(err), fmt.Sprint(err)
		})
	})
	return f
}

// Thousands of short-lived processes a second: memory comes back to where it was,
// per-process state in sonde and in the kernel goes back to baseline, and nothing leaks.
func TestChurn(t *testing.T) {
	testenv.RequireRoot(t)
	churn := buildWorkload(t, "churn", churnC, "-O2")
	short := buildWorkload(t, "short", "int main(void){volatile unsigned long a=0;for(int i=0;i<100000;i++)a+=i;return 0;}\n", "-O1")
	// Fifteen seconds is some ten thousand processes: a leak of a kilobyte each shows here,
	// one of a few hundred bytes in the five minutes of make soak.
	secs := 15
	if soak() {
		secs = 300
	}
	// The churn runs in a cgroup of its own, which sonde profiles alone: what else the host
	// runs (a build beside the tests, say) would fill sonde's bounded caches with names
	// and stacks of its own between the two readings and pass for a leak.
	cg := churnCgroup(t)
	a := startAgent(t, "--frequency", "99", "--interval", "2s", "--cgroup", cg.Name())
	inCgroup := func(cmd *exec.Cmd) *exec.Cmd {
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
		return cmd
	}
	// A short churn first, then two intervals, so that the baseline holds what sonde loads
	// once (kallsyms, its own tables) and its bounded caches as churn fills them (stack
	// chunks of processes at new addresses, names): what grows past that is a leak. The
	// warm-up was 10 s until 2026-11-29; with 5 s the heap's floor read 2.6 MiB before the
	// 15 s churn and 2.7 MiB after it. The intervals are the agent's 2 s.
	if err := inCgroup(exec.Command(churn, "1000", "5", short)).Run(); err != nil {
		t.Fatalf("churn: %v", err)
	}
	time.Sleep(4 * time.Second)
	heap0, fds0, gor0, kern0, tracked0 := a.stats(t)
	heap0 = a.floorHeap(t, heap0)
	cmd := inCgroup(exec.Command(churn, "1000", strconv.Itoa(secs), short))
	if err := cmd.Run(); err != nil {
		t.Fatalf("churn: %v", err)
	}
	during := a.metrics(t)
	// Exited processes are forgotten at the next intervals: wait for that, however long
	// a busy host makes it take; what never comes back fails below.
	testenv.Wait("per-process state back to its baseline", testenv.SampleTimeout, func() (bool, string) {
		_, _, _, kern, tracked := a.stats(t)
		return kern <= kern0+5 && tracked <= tracked0+5, fmt.Sprintf("%v kernel processes, %v tracked", kern, tracked)
	})
	heap1, fds1, gor1, kern1, tracked1 := a.stats(t)
	// Goroutines and descriptors have their moments too (a scrape's connection, an
	// interval's naming): a leak is what does not come back, so the lowest count seen
	// while waiting for the baseline is the one compared.
	_ = testenv.Wait("goroutines and descriptors back to their baseline", testenv.SampleTimeout, func() (bool, string) {
		_, fds, gor, _, _ := a.stats(t)
		fds1, gor1 = min(fds1, fds), min(gor1, gor)
		return fds1 <= fds0+2 && gor1 <= gor0+2, fmt.Sprintf("%v fds, %v goroutines", fds, gor)
	})
	heap1 = a.floorHeap(t, heap1)
	t.Logf("before: heap %.1f MiB (floor), %v fds, %v goroutines, %v kernel processes, %v tracked", heap0/(1<<20), fds0, gor0, kern0, tracked0)
	t.Logf("after:  heap %.1f MiB (floor), %v fds, %v goroutines, %v kernel processes, %v tracked", heap1/(1<<20), fds1, gor1, kern1, tracked1)
	t.Logf("during: %v samples, RSS %.1f MiB", during["sonde_samples_total"], during["sonde_memory_rss_bytes"]/(1<<20))
	// Tens of thousands of processes came and went: a leak of a few hundred bytes each
	// shows as more than a tenth of the heap and 4 MiB of slack. The slack is for the live
	// heap's reading, which is as of the last collection: an idle agent collects seldom,
	// and the last one may have caught an interval's naming pass holding its buffers.
	if heap1 > heap0*1.1+4<<20 {
		t.Errorf("heap %.1f MiB after the churn, %.1f MiB before: more than 10%% and 4 MiB more", heap1/(1<<20), heap0/(1<<20))
	}
	if fds1 > fds0+2 || gor1 > gor0+2 {
		t.Errorf("file descriptors %v → %v, goroutines %v → %v: a leak", fds0, fds1, gor0, gor1)
	}
	if kern1 > kern0+5 || tracked1 > tracked0+5 {
		t.Errorf("processes in the kernel %v → %v, tracked %v → %v: per-process state outlives its processes", kern0, kern1, tracked0, tracked1)
	}
	a.stop(t)
}

// A stalled reader (sonde stopped for a moment) lets the ring buffer overflow at the
// highest rate: the losses are counted and reported, and sampling goes on afterwards.
func TestRingOverflow(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "chain", chainC, "-O2")
	startWorkload(t, bin, 60)
	startWorkload(t, bin, 60)
	a := startAgent(t, "--frequency", strconv.Itoa(maxFrequency), "--interval", "1s", "--memory-limit", "64MiB")
	a.waitMetrics(t, "samples to flow", func(m map[string]float64) bool { return m["sonde_samples_total"] >= 1000 })
	// The stall is what the test is about: at this rate, 2 s fill the ring many times over.
	a.cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(2 * time.Second)
	a.cmd.Process.Signal(syscall.SIGCONT)
	before := a.waitMetrics(t, "the reader to drain the ring and count the losses", func(m map[string]float64) bool {
		return m["sonde_samples_lost_total"] > 0
	})
	after := a.waitMetrics(t, "sampling to go on after the overflow", func(m map[string]float64) bool {
		return m["sonde_samples_total"] > before["sonde_samples_total"]+1000
	})
	if code, _ := a.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after the overflow: %d", code)
	}
	a.stop(t)
	log := a.stderr.String()
	if !strings.Contains(log, "ring buffer full") {
		t.Errorf("the overflow was not reported:\n%s", log)
	}
	if summaryCount(t, log, "kernel.ring_buffer_full") == 0 {
		t.Errorf("the summary counts no lost samples")
	}
	t.Logf("%v samples, %v lost", after["sonde_samples_total"], after["sonde_samples_lost_total"])
}

// writeBigBinary assembles a program with n functions, each with call frame information
// (a table of about 2n rows to build), and pads the file to about padMiB MiB.
func writeBigBinary(t *testing.T, n, padMiB int) string {
	t.Helper()
	gcc := testenv.RequireTool(t, "gcc")
	objcopy := testenv.RequireTool(t, "objcopy")
	dir := t.TempDir()
	var asm bytes.Buffer
	asm.WriteString(".text\n")
	for i := range n {
		fmt.Fprintf(&asm, ".globl f%d\n.type f%d,@function\nf%d:\n.cfi_startproc\npushq %%rbx\n.cfi_adjust_cfa_offset 8\npopq %%rbx\n.cfi_adjust_cfa_offset -8\nret\n.cfi_endproc\n", i, i, i)
	}
	asm.WriteString(`.globl main
.type main,@function
main:
.cfi_startproc
1: call f0
jmp 1b
.cfi_endproc
`)
	src := filepath.Join(dir, "big.s")
	os.WriteFile(src, asm.Bytes(), 0o644)
	bin := filepath.Join(dir, "big")
	if out, err := exec.Command(gcc, "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	pad := filepath.Join(dir, "pad")
	f, _ := os.Create(pad)
	f.Truncate(int64(padMiB) << 20)
	f.Close()
	if out, err := exec.Command(objcopy, "--add-section", ".pad="+pad, "--set-section-flags", ".pad=readonly", bin).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v\n%s", err, out)
	}
	os.Remove(pad)
	return bin
}

// A program starting from a 500 MB binary with a large unwind table does not make the ring
// buffer overflow: its file is read and its table built off the goroutine that drains the
// ring.
func TestBigBinaryDoesNotStallSampling(t *testing.T) {
	testenv.RequireRoot(t)
	big := writeBigBinary(t, 300000, 500)
	st, _ := os.Stat(big)
	a := startAgent(t, "--frequency", "999", "--interval", "2s")
	busy := buildWorkload(t, "chain", chainC, "-O2")
	startWorkload(t, busy, 30)
	cmd := exec.Command(big)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var m map[string]float64
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		m = a.metrics(t)
		if m["sonde_unwind_rows"] > 500000 || time.Now().After(deadline) {
			break
		}
	}
	if m["sonde_unwind_rows"] <= 500000 {
		t.Errorf("the big binary's table (%d functions) never reached the kernel: %v rows", 300000, m["sonde_unwind_rows"])
	}
	if lost := m["sonde_samples_lost_total"]; lost != 0 {
		t.Errorf("%v samples lost while a %d MiB binary started", lost, st.Size()>>20)
	}
	a.stop(t)
	t.Logf("%d MiB binary; %v samples, %v lost, %v rows", st.Size()>>20, m["sonde_samples_total"], m["sonde_samples_lost_total"], m["sonde_unwind_rows"])
}

// busyGo is a Go program busy on one core, allocating: the Go side of the memory test.
const busyGo = `package main

import (
	"encoding/json"
	"sort"
	"strings"
)

type rec struct {
	A string
	B []int
}

func main() {
	for {
		var rs []rec
		for i := 0; i < 2000; i++ {
			rs = append(rs, rec{A: strings.Repeat("x", i%50), B: make([]int, i%100)})
		}
		b, _ := json.Marshal(rs)
		var back []rec
		json.Unmarshal(b, &back)
		sort.Slice(back, func(i, j int) bool { return back[i].A < back[j].A })
	}
}
`

// cbusyC sorts and copies for ever: libc's qsort and memmove, named from its DWARF.
const cbusyC = `#include <stdlib.h>
#include <string.h>
static int cmp(const void*a,const void*b){return *(const int*)a-*(const int*)b;}
int main(void){int n=100000;int*v=malloc(n*4);char*a=malloc(1<<20),*b=malloc(1<<20);
for(;;){for(int i=0;i<n;i++)v[i]=rand();qsort(v,n,4,cmp);memmove(a,b,1<<20);}}
`

// Whatever runs, sonde stays within --memory-limit: here a C program without frame
// pointers and a Go program, host-wide with full symbolization (libc's DWARF included),
// under a limit well below the default.
func TestMemoryLimitKept(t *testing.T) {
	testenv.RequireRoot(t)
	const limit = 64 << 20
	c := buildWorkload(t, "cbusy", cbusyC, "-O2", "-fomit-frame-pointer")
	startWorkload(t, c, 60)
	goBin := testprog.BuildGo(t, busyGo)
	g := exec.Command(goBin)
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { g.Process.Kill(); g.Wait() }()
	// Five intervals here, a hundred and fifty in make soak.
	secs := 10
	if soak() {
		secs = 300
	}
	a := startAgent(t, "--frequency", "99", "--interval", "2s", "--memory-limit", "64MiB", "--duration", strconv.Itoa(secs)+"s")
	var peak int64
	for {
		select {
		case <-a.done:
			a.done <- nil
		case <-time.After(500 * time.Millisecond):
			if kib, err := statusKiB(a.cmd.Process.Pid, "VmHWM"); err == nil {
				peak = max(peak, kib<<10)
			}
			continue
		}
		break
	}
	if peak == 0 {
		t.Fatal("no memory readings")
	}
	if peak > limit {
		t.Errorf("peak RSS %.1f MiB, over --memory-limit 64MiB", float64(peak)/(1<<20))
	}
	if n := summaryCount(t, a.stderr.String(), "symbols.locations_named"); n == 0 {
		t.Error("nothing was named: the test did not exercise symbolization")
	}
	t.Logf("peak RSS %.1f MiB under --memory-limit 64MiB", float64(peak)/(1<<20))
}

// statusKiB reads a field of /proc/PID/status in KiB.
func statusKiB(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// An exec storm host-wide: processes that exit within a few milliseconds, unsampled, are
// never read (counted as exited in their grace) and leave no state in the kernel, while a
// process that runs on is read.
func TestExecStormUnread(t *testing.T) {
	testenv.RequireRoot(t)
	a := startAgent(t, "--frequency", "19", "--interval", "1s")
	before := a.metrics(t)
	// As fast as the shell starts them: /bin/true and sh -c, two execs an iteration.
	storm := exec.Command("sh", "-c", `n=0; end=$(($(date +%s)+4)); while [ $(date +%s) -lt $end ]; do /bin/true; sh -c :; n=$((n+1)); done; echo $n`)
	out, err := storm.Output()
	if err != nil {
		t.Fatal(err)
	}
	iterations, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	execs := float64(3 * iterations) // date, true and sh
	if execs < 300 {
		t.Fatalf("only %v execs in the storm", execs)
	}
	key := func(outcome string) string { return `sonde_process_reads_total{outcome="` + outcome + `"}` }
	after := a.waitMetrics(t, "the storm's processes to be let go", func(m map[string]float64) bool {
		return m[key("exited_in_grace")]-before[key("exited_in_grace")] >= execs/2 &&
			m[`sonde_bpf_map_entries{map="proc_maps"}`] <= before[`sonde_bpf_map_entries{map="proc_maps"}`]+5
	})
	reads := after[key("read")] - before[key("read")]
	t.Logf("%v execs: %v read, %v exited in their grace, %v rate limited", execs, reads,
		after[key("exited_in_grace")]-before[key("exited_in_grace")], after[key("rate_limited")]-before[key("rate_limited")])
	if reads > execs/4 {
		t.Errorf("%v of %v short processes read, want under a quarter", reads, execs)
	}
	// A process that runs on is read once its grace ends.
	w := exec.Command("sleep", "30")
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { w.Process.Kill(); w.Wait() }()
	a.waitMetrics(t, "the long-lived process to be read", func(m map[string]float64) bool {
		return m[key("read")] > after[key("read")]
	})
	a.stop(t)
}
