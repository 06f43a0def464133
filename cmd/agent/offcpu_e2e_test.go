package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// waitersC runs three threads, each computing ~30 ms and then waiting ~70 ms of every
// 100 ms, each its own way: nanosleep, poll on a pipe no one writes, and a futex (a
// condition variable no one signals). At exit it prints, per thread, its id, the
// function it waits in and the nanoseconds it spent inside the blocking calls.
const waitersC = `#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#define KEEP __attribute__((noinline))
static double secs;
static volatile unsigned long sink;
static int fds[2];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static long long ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000LL+t.tv_nsec;}
KEEP void crunch(long long d){long long end=ns()+d; while(ns()<end) for(int i=0;i<1000;i++) sink+=i;}
KEEP void wait_sleep(void){struct timespec t={0,70000000}; nanosleep(&t,0); sink++;}
KEEP void wait_poll(void){struct pollfd p={fds[0],POLLIN,0}; poll(&p,1,70); sink++;}
KEEP void wait_futex(void){struct timespec t; clock_gettime(CLOCK_REALTIME,&t); t.tv_nsec+=70000000; if(t.tv_nsec>=1000000000){t.tv_sec++;t.tv_nsec-=1000000000;}
  pthread_mutex_lock(&mu); pthread_cond_timedwait(&cv,&mu,&t); pthread_mutex_unlock(&mu); sink++;}
struct job{const char*name; void(*wait)(void); long long blocked; int tid;};
KEEP void *worker(void *arg){struct job*j=arg; j->tid=syscall(SYS_gettid); long long end=ns()+(long long)(secs*1e9);
  while(ns()<end){crunch(30000000); long long t=ns(); j->wait(); j->blocked+=ns()-t;} return 0;}
int main(int argc,char**argv){secs=atof(argv[1]); if(pipe(fds)) return 1;
  struct job jobs[3]={{"wait_sleep",wait_sleep},{"wait_poll",wait_poll},{"wait_futex",wait_futex}};
  pthread_t th[3]; for(int i=0;i<3;i++) pthread_create(&th[i],0,worker,&jobs[i]);
  for(int i=0;i<3;i++) pthread_join(th[i],0);
  for(int i=0;i<3;i++) printf("%d %s %lld\n",jobs[i].tid,jobs[i].name,jobs[i].blocked);
  return 0;}
`

// TestOffCPUWaits: sonde record --off-cpu shows where each thread waited, for as long as
// it measured itself waiting, under the function it waited in; the CPU samples of the same
// run still show where they computed.
func TestOffCPUWaits(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "waiters", waitersC, "-O1", "-g", "-pthread")
	dir := t.TempDir()
	out := filepath.Join(dir, "waiters.pb.gz")
	status, stdout, stderr := runRecord(t, dir, "--off-cpu", "--output", out, "--output", "waiters.folded", "--top", "5", "--", bin, "6")
	if status != 0 {
		t.Fatalf("status %d\n%s", status, stderr)
	}
	type thread struct {
		wait    string
		blocked time.Duration
	}
	threads := map[int64]thread{}
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		var tid int64
		var th thread
		var blocked int64
		if _, err := fmt.Sscanf(sc.Text(), "%d %s %d", &tid, &th.wait, &blocked); err != nil {
			t.Fatalf("program output %q: %v", sc.Text(), err)
		}
		th.blocked = time.Duration(blocked)
		threads[tid] = th
	}
	if len(threads) != 3 {
		t.Fatalf("program printed %q", stdout)
	}
	p := readProfile(t, out)
	off, cpu := -1, -1
	for i, st := range p.SampleType {
		switch st.Type {
		case "off_cpu":
			off = i
		case "samples":
			cpu = i
		}
	}
	if off < 0 || cpu < 0 || p.SampleType[off].Unit != "nanoseconds" {
		t.Fatalf("sample types %v: want samples and off_cpu nanoseconds", p.SampleType)
	}
	offTotal, offUnder := map[int64]int64{}, map[int64]int64{}
	cpuTotal, cpuCrunch := map[int64]int64{}, map[int64]int64{}
	for _, s := range p.Sample {
		tid := s.NumLabel["tid"]
		if len(tid) != 1 {
			continue
		}
		th, ok := threads[tid[0]]
		if !ok {
			continue
		}
		fns := names(s)
		offTotal[tid[0]] += s.Value[off]
		if chainIn(fns, th.wait, "worker") {
			offUnder[tid[0]] += s.Value[off]
		}
		cpuTotal[tid[0]] += s.Value[cpu]
		if chainIn(fns, "crunch", "worker") {
			cpuCrunch[tid[0]] += s.Value[cpu]
		}
	}
	for tid, th := range threads {
		got := time.Duration(offTotal[tid])
		ratio := float64(got) / float64(th.blocked)
		under := float64(offUnder[tid]) / float64(max(offTotal[tid], 1))
		t.Logf("%s (tid %d): waited %v by its own clock, off-CPU %v (%.3f); %.3f under %s <- worker; CPU %d samples, %.3f in crunch",
			th.wait, tid, th.blocked.Round(time.Millisecond), got.Round(time.Millisecond), ratio, under, th.wait, cpuTotal[tid], float64(cpuCrunch[tid])/float64(max(cpuTotal[tid], 1)))
		if ratio < 0.85 || ratio > 1.15 {
			t.Errorf("%s: off-CPU %v for %v waited: not within 15%%", th.wait, got, th.blocked)
		}
		if under < 0.9 {
			t.Errorf("%s: %.3f of the off-CPU time under %s <- worker, want at least 0.9", th.wait, under, th.wait)
		}
		if cpuTotal[tid] == 0 || float64(cpuCrunch[tid]) < 0.9*float64(cpuTotal[tid]) {
			t.Errorf("%s: CPU samples %d, %d of them in crunch: the CPU profile changed", th.wait, cpuTotal[tid], cpuCrunch[tid])
		}
	}
	if !strings.Contains(stderr, "s of waiting)") {
		t.Errorf("the top table of an off-CPU run does not say its samples are time waited:\n%s", stderr)
	}
	folded, err := os.ReadFile(filepath.Join(dir, "waiters.folded"))
	if err != nil {
		t.Fatal(err)
	}
	for _, th := range threads {
		if !strings.Contains(string(folded), ";worker;"+th.wait+";") {
			t.Errorf("the folded stacks (off-CPU view) lack worker;%s:\n%s", th.wait, folded)
		}
	}
}

// goWaitersGo runs goroutines that wait in Go's scheduler, each its own way, between
// bursts of work: two receive from a channel fed every 40 ms, one waits for a mutex that
// another holds for 30 ms at a time. At exit it prints the nanoseconds the receivers and
// the mutex waiter spent blocked, by their own clocks.
const goWaitersGo = `package main

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

var sink atomic.Uint64

//go:noinline
func crunch(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		for i := 0; i < 1000; i++ {
			sink.Add(uint64(i))
		}
	}
}

//go:noinline
func chanWaiter(ch <-chan int, end time.Time, blocked *atomic.Int64) {
	for time.Now().Before(end) {
		t := time.Now()
		if _, ok := <-ch; !ok {
			return
		}
		blocked.Add(int64(time.Since(t)))
		crunch(2 * time.Millisecond)
	}
}

//go:noinline
func mutexWaiter(mu *sync.Mutex, end time.Time, blocked *atomic.Int64) {
	for time.Now().Before(end) {
		t := time.Now()
		mu.Lock()
		blocked.Add(int64(time.Since(t)))
		crunch(time.Millisecond)
		mu.Unlock()
		time.Sleep(time.Millisecond)
	}
}

//go:noinline
func lockHolder(mu *sync.Mutex, end time.Time) {
	for time.Now().Before(end) {
		mu.Lock()
		crunch(30 * time.Millisecond)
		mu.Unlock()
		time.Sleep(time.Millisecond)
	}
}

func main() {
	secs, _ := strconv.ParseFloat(os.Args[1], 64)
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	var chanBlocked, mutexBlocked atomic.Int64
	ch := make(chan int)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); chanWaiter(ch, end, &chanBlocked) }()
	}
	var mu sync.Mutex
	wg.Add(2)
	go func() { defer wg.Done(); lockHolder(&mu, end) }()
	go func() { defer wg.Done(); mutexWaiter(&mu, end, &mutexBlocked) }()
	go func() {
		for time.Now().Before(end) {
			time.Sleep(40 * time.Millisecond)
			select {
			case ch <- 1:
			default:
			}
		}
		close(ch)
	}()
	wg.Wait()
	fmt.Printf("chanWaiter %d\nmutexWaiter %d\n", chanBlocked.Load(), mutexBlocked.Load())
}
`

// TestOffCPUGoroutines: with --off-cpu-goroutines, goroutines blocked on a channel and on
// a mutex show under their own functions, for as long as they measured themselves blocked.
// The program is stripped, as production builds often are (TestOffCPUStateBounded runs
// an unstripped one).
func TestOffCPUGoroutines(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildGoWorkload(t, "gowaiters", goWaitersGo, "-ldflags=-s -w")
	dir := t.TempDir()
	out := filepath.Join(dir, "gowaiters.pb.gz")
	status, stdout, stderr := runRecord(t, dir, "--off-cpu", "--off-cpu-goroutines", "--output", out, "--top", "0", "--", bin, "5")
	if status != 0 {
		t.Fatalf("status %d\n%s", status, stderr)
	}
	measured := map[string]time.Duration{}
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		var fn string
		var ns int64
		if _, err := fmt.Sscanf(sc.Text(), "%s %d", &fn, &ns); err != nil {
			t.Fatalf("program output %q: %v", sc.Text(), err)
		}
		measured["main."+fn] = time.Duration(ns)
	}
	p := readProfile(t, out)
	off := -1
	for i, st := range p.SampleType {
		if st.Type == "off_cpu" {
			off = i
		}
	}
	if off < 0 {
		t.Fatalf("sample types %v: no off_cpu", p.SampleType)
	}
	// Where each waits, leaf first: the runtime's park under the blocking operation.
	chains := map[string][]string{
		"main.chanWaiter":  {"runtime.gopark", "runtime.chanrecv", "main.chanWaiter", "runtime.goexit"},
		"main.mutexWaiter": {"runtime.gopark", "sync.(*Mutex).Lock", "main.mutexWaiter", "runtime.goexit"},
	}
	got := map[string]time.Duration{}
	for _, s := range p.Sample {
		fns := names(s)
		for fn, chain := range chains {
			if chainIn(fns, chain...) {
				got[fn] += time.Duration(s.Value[off])
			}
		}
	}
	if len(measured) != len(chains) {
		t.Fatalf("program printed %q", stdout)
	}
	for fn, m := range measured {
		ratio := float64(got[fn]) / float64(m)
		t.Logf("%s: blocked %v by its own clock, off-CPU %v under %s (%.3f)", fn, m.Round(time.Millisecond), got[fn].Round(time.Millisecond), strings.Join(chains[fn], " <- "), ratio)
		if ratio < 0.85 || ratio > 1.15 {
			t.Errorf("%s: off-CPU %v for %v blocked: not within 15%%", fn, got[fn], m)
		}
	}
}

// chainIn reports whether a stack (leaf first) holds the functions of chain in that order.
func chainIn(stack []string, chain ...string) bool {
	i := 0
	for _, f := range stack {
		if i < len(chain) && f == chain[i] {
			i++
		}
	}
	return i == len(chain)
}

// exitWhileWaitingC starts threads that go to sleep and exit at once when woken, in a
// loop, so that threads exit soon after coming off a wait and their ids are reused.
const exitWhileWaitingC = `#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#define KEEP __attribute__((noinline))
KEEP void *nap_then_exit(void *a){struct timespec t={0,2000000}; nanosleep(&t,0); return 0;}
int main(int argc,char**argv){struct timespec s,n; clock_gettime(CLOCK_MONOTONIC,&s); double secs=atof(argv[1]);
  for(;;){clock_gettime(CLOCK_MONOTONIC,&n); if(n.tv_sec-s.tv_sec+(n.tv_nsec-s.tv_nsec)/1e9>secs) break;
    pthread_t th[8]; for(int i=0;i<8;i++) pthread_create(&th[i],0,nap_then_exit,0); for(int i=0;i<8;i++) pthread_join(th[i],0);}
  return 0;}
`

// Threads that wait and exit by the thousand, and processes that come and go, Go
// programs among them that exit with goroutines parked: what sonde follows of waiting
// threads and goroutines, in the kernel and in user space, goes back to where it was.
func TestOffCPUStateBounded(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "exitwait", exitWhileWaitingC, "-O1", "-pthread")
	goBin := buildGoWorkload(t, "gowaiters", goWaitersGo)
	cg := churnCgroup(t)
	a := startAgent(t, "--off-cpu", "--off-cpu-goroutines", "--interval", "1s", "--cgroup", cg.Name())
	base := a.waitMetrics(t, "the agent to serve its metrics", func(m map[string]float64) bool {
		_, ok := m[`sonde_offcpu_threads{where="kernel"}`]
		return ok
	})
	for range 3 {
		for _, prog := range []string{bin, goBin} {
			cmd := exec.Command(prog, "1")
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
			if err := cmd.Run(); err != nil {
				t.Fatal(err)
			}
		}
	}
	during := a.metrics(t)
	if during["sonde_offcpu_samples_total"] == 0 {
		t.Fatalf("no off-CPU samples of the threads' waits: %v", during)
	}
	if during[`sonde_offcpu_goroutine_parks_total{outcome="walked"}`] == 0 {
		t.Fatalf("no goroutine parks walked: %v", during)
	}
	after := a.waitMetrics(t, "followed waiting threads back to the baseline", func(m map[string]float64) bool {
		return m[`sonde_offcpu_threads{where="kernel"}`] <= base[`sonde_offcpu_threads{where="kernel"}`] &&
			m[`sonde_offcpu_threads{where="user"}`] <= base[`sonde_offcpu_threads{where="user"}`]+1
	})
	t.Logf("off-CPU samples %v, goroutine parks walked %v; waits followed: kernel %v → %v, user %v → %v", during["sonde_offcpu_samples_total"],
		during[`sonde_offcpu_goroutine_parks_total{outcome="walked"}`],
		base[`sonde_offcpu_threads{where="kernel"}`], after[`sonde_offcpu_threads{where="kernel"}`],
		base[`sonde_offcpu_threads{where="user"}`], after[`sonde_offcpu_threads{where="user"}`])
	a.stop(t)
}

// tailC ends relay with a tail call to spin, where the samples land: at run time relay
// leaves no frame.
const tailC = `#include <stdlib.h>
#include <time.h>
#define KEEP __attribute__((noinline))
static volatile unsigned long sink;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
KEEP void spin(double s){double e=now()+s; while(now()<e) for(int i=0;i<1000;i++) sink+=i;}
KEEP void relay(double s){sink++; spin(s);}
int main(int argc,char**argv){double end=now()+atof(argv[1]); while(now()<end) relay(0.01); return 0;}
`

// A function that ends by jumping to another leaves no frame; sonde puts it back from the
// code: spin's samples read spin <- relay <- main, as the source says.
func TestTailCallFramesRecovered(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "tail", tailC, "-O2", "-g", "-fomit-frame-pointer")
	objdump := testenv.RequireTool(t, "objdump")
	dis, err := exec.Command(objdump, "-d", "--no-show-raw-insn", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?s)<relay>:.*?jmp\s+[0-9a-f]+ <spin>`).Match(dis) {
		t.Fatalf("the compiler did not end relay with a jump to spin: the test's premise\n%s", dis)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "tail.pb.gz")
	if status, _, stderr := runRecord(t, dir, "--output", out, "--top", "0", "--", bin, "3"); status != 0 {
		t.Fatalf("status %d\n%s", status, stderr)
	}
	p := readProfile(t, out)
	var in, chained int64
	for _, s := range p.Sample {
		fns := names(s)
		if len(fns) == 0 || !slices.Contains(fns, "spin") {
			continue
		}
		in += s.Value[0]
		if chainIn(fns, "spin", "relay", "main") {
			chained += s.Value[0]
		}
	}
	share := float64(chained) / float64(max(in, 1))
	t.Logf("%d samples in spin, %.3f of them under relay <- main", in, share)
	if in < 100 || share < 0.95 {
		t.Errorf("%.3f of %d samples in spin read spin <- relay <- main, want at least 0.95", share, in)
	}
}
