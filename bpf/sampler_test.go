package bpf

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sonde-profiler/sonde/internal/cgroup"
	"github.com/sonde-profiler/sonde/internal/testenv"
)

type recorder struct {
	samples   []Sample
	processes []ProcessEvent
}

func (r *recorder) HandleSample(s *Sample) {
	c := *s
	c.User = append([]uint64(nil), s.User...)
	c.Kernel = append([]uint64(nil), s.Kernel...)
	r.samples = append(r.samples, c)
}

func (r *recorder) HandleProcessEvent(e ProcessEvent) { r.processes = append(r.processes, e) }

// TestSamplerFiltersInKernel samples a busy child and nothing else, and sees it exit.
func TestSamplerFiltersInKernel(t *testing.T) {
	testenv.RequireRoot(t)
	busy := exec.Command("sh", "-c", "while :; do :; done")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	defer busy.Process.Kill()
	pid := uint32(busy.Process.Pid)

	s, err := Load(Config{PIDs: []uint32{pid}, Frequency: 199, KernelStacks: true, CollectStats: true})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer s.Close()
	if err := s.Start(); err != nil {
		t.Fatalf("start: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var rec recorder
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, &rec) }()
	waitSamples(t, s, 40)
	before, err := s.Counters()
	if err != nil {
		t.Fatal(err)
	}
	busy.Process.Kill()
	busy.Wait()
	// The exit event follows the last sample: wait for it, not for a while.
	testenv.WaitFor(t, "the busy child's exit event", testenv.StartTimeout, func() (bool, string) {
		c, err := s.Counters()
		return err == nil && c.ProcessEvents > before.ProcessEvents, fmt.Sprintf("%d process events, %v", c.ProcessEvents, err)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}

	if len(rec.samples) < 40 {
		t.Fatalf("got %d samples of a busy process, where the kernel counted at least 40", len(rec.samples))
	}
	for _, smp := range rec.samples {
		if smp.PID != pid {
			t.Fatalf("sample of pid %d leaked through the filter for pid %d", smp.PID, pid)
		}
		if len(smp.User) == 0 && smp.UserErr == nil {
			t.Fatalf("sample without user stack and without error: %+v", smp)
		}
		if d := time.Since(smp.Time); d < 0 || d > 10*time.Second {
			t.Fatalf("sample time %v is %v away from now", smp.Time, d)
		}
	}
	if smp := rec.samples[0]; smp.Comm != "sh" {
		t.Errorf("comm = %q, want sh", smp.Comm)
	}
	sawExit := false
	for _, e := range rec.processes {
		sawExit = sawExit || (e.Kind == ProcessExit && e.PID == pid)
	}
	if !sawExit {
		t.Errorf("no exit event for pid %d among %+v", pid, rec.processes)
	}
	c, err := s.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.Samples != uint64(len(rec.samples)) {
		t.Errorf("kernel counted %d samples, user space read %d", c.Samples, len(rec.samples))
	}
	if full, err := s.RingBufferFull(); err != nil || full != c.RingBufferFull {
		t.Errorf("ring buffer full: %d, %v; the counters say %d", full, err, c.RingBufferFull)
	}
	st, err := s.ProgramStats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Runs == 0 || st.Runtime <= 0 {
		t.Errorf("program stats %+v: want runs and runtime", st)
	}
	t.Logf("%d samples, %d runs, %v per run", len(rec.samples), st.Runs, st.Runtime/time.Duration(st.Runs))
}

// A cgroup filter samples the processes of a cgroup and of the cgroups below it, and no
// others.
func TestSamplerFiltersByCgroup(t *testing.T) {
	testenv.RequireRoot(t)
	root, err := cgroup.Root("/proc/self/mountinfo")
	if err != nil {
		testenv.Unavailable(t, "no cgroup v2 here: %v", err)
	}
	parent, err := os.MkdirTemp(root, "sonde-test-")
	if err != nil {
		testenv.Unavailable(t, "cannot make a cgroup under %s: %v", root, err)
	}
	defer os.Remove(parent)
	child := filepath.Join(parent, "child")
	if err := os.Mkdir(child, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(child)
	var st syscall.Stat_t
	if err := syscall.Stat(parent, &st); err != nil {
		t.Fatal(err)
	}
	inside := exec.Command("sh", "-c", "while :; do :; done")
	outside := exec.Command("sh", "-c", "while :; do :; done")
	for _, c := range []*exec.Cmd{inside, outside} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer func(c *exec.Cmd) { c.Process.Kill(); c.Wait() }(c)
	}
	// Moved into the child: the filter names only its parent.
	if err := os.WriteFile(filepath.Join(child, "cgroup.procs"), []byte(strconv.Itoa(inside.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Load(Config{Cgroups: []uint64{st.Ino}, Frequency: 199})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer s.Close()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var rec recorder
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, &rec) }()
	waitSamples(t, s, 40) // of the cgroup's processes only: the kernel filters the rest
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	counts := map[uint32]int{}
	for _, smp := range rec.samples {
		counts[smp.PID]++
	}
	if counts[uint32(inside.Process.Pid)] < 20 {
		t.Errorf("%d samples of the process in the filtered cgroup's child", counts[uint32(inside.Process.Pid)])
	}
	if len(counts) != 1 {
		t.Errorf("samples of processes outside the cgroup leaked through: %v", counts)
	}
}

// TestSamplerFollowsForks: with FollowForks a target's children and grandchildren are
// sampled from their start, a process outside the family is not, and the filter lets go
// of each follower as it exits.
func TestSamplerFollowsForks(t *testing.T) {
	testenv.RequireRoot(t)
	outsider := exec.Command("sh", "-c", "while :; do :; done")
	if err := outsider.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { outsider.Process.Kill(); outsider.Wait() }()
	// The target waits for a line, then starts a child that starts a grandchild; both spin.
	target := exec.Command("sh", "-c", `read go; sh -c 'while :; do :; done & while :; do :; done'`)
	target.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	trigger, err := target.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	killFamily := func() { syscall.Kill(-target.Process.Pid, syscall.SIGKILL) }
	defer killFamily()
	pid := uint32(target.Process.Pid)

	s, err := Load(Config{PIDs: []uint32{pid}, Frequency: 199, FollowForks: true})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer s.Close()
	if got := s.objs.TargetPids.MaxEntries(); got != MaxFollowed {
		t.Errorf("target_pids holds %d, want %d", got, MaxFollowed)
	}
	if err := s.Start(); err != nil {
		t.Fatalf("start: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var rec recorder
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, &rec) }()
	trigger.Write([]byte("go\n"))
	time.Sleep(time.Second)
	followed := targets(t, s)
	killFamily()
	target.Wait()
	time.Sleep(200 * time.Millisecond)
	left := targets(t, s)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}

	busy := map[uint32]int{}
	for _, smp := range rec.samples {
		if smp.PID == uint32(outsider.Process.Pid) {
			t.Fatalf("the outsider %d was sampled", smp.PID)
		}
		if !followed[smp.PID] {
			t.Fatalf("sample of pid %d, not among the followed %v", smp.PID, followed)
		}
		busy[smp.PID]++
	}
	delete(busy, pid)
	if len(busy) != 2 || len(followed) != 3 {
		t.Errorf("samples by pid %v from the followed %v: want the child and the grandchild", busy, followed)
	}
	if len(left) != 0 {
		t.Errorf("exited processes still in the filter: %v", left)
	}
}

// targets lists the PID filter's entries.
// waitSamples waits until the kernel has recorded n samples of the sampler's targets,
// however long a busy host takes to give them the CPU.
func waitSamples(t *testing.T, s *Sampler, n uint64) {
	t.Helper()
	testenv.WaitFor(t, fmt.Sprintf("%d samples", n), testenv.SampleTimeout, func() (bool, string) {
		c, err := s.Counters()
		if err != nil {
			return false, err.Error()
		}
		return c.Samples >= n, fmt.Sprintf("%d samples", c.Samples)
	})
}

func targets(t *testing.T, s *Sampler) map[uint32]bool {
	t.Helper()
	out := map[uint32]bool{}
	var pid uint32
	var v uint8
	it := s.objs.TargetPids.Iterate()
	for it.Next(&pid, &v) {
		out[pid] = true
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// threadExecC execs a spinning shell from a second thread once a byte arrives: the kernel
// kills the leader thread, and the exec'ing thread takes over the process's PID.
const threadExecC = `#include <pthread.h>
#include <unistd.h>
static void *run(void *a){char b; (void)a; if (read(0,&b,1)==1) execl("/bin/sh","sh","-c","while :; do :; done",(char*)0); return 0;}
int main(void){pthread_t t; pthread_create(&t,0,run,0); pthread_join(t,0); return 0;}
`

// A followed process whose second thread execs is the same process afterwards: its
// leader thread's exit does not take it out of the filter.
func TestSamplerFollowsExecFromThread(t *testing.T) {
	testenv.RequireRoot(t)
	gcc := testenv.RequireTool(t, "gcc")
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "texec.c"), filepath.Join(dir, "texec")
	if err := os.WriteFile(src, []byte(threadExecC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-pthread", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	target := exec.Command(bin)
	trigger, err := target.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { target.Process.Kill(); target.Wait() }()
	pid := uint32(target.Process.Pid)

	s, err := Load(Config{PIDs: []uint32{pid}, Frequency: 199, FollowForks: true})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer s.Close()
	if err := s.Start(); err != nil {
		t.Fatalf("start: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var rec recorder
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, &rec) }()
	trigger.Write([]byte{1})
	// A loaded host may take a while to run the exec: sample the shell for a second once it is there.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); string(comm) == "sh\n" {
			break
		}
	}
	time.Sleep(time.Second)
	followed := targets(t, s)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if !followed[pid] {
		t.Errorf("pid %d left the filter when its leader thread died in the exec: %v", pid, followed)
	}
	// Its event stream says exec, never exit: the leader thread's death is not the process's.
	execs := 0
	for _, e := range rec.processes {
		if e.PID != pid {
			continue
		}
		if e.Kind == ProcessExit {
			t.Errorf("an exit event for pid %d, which only exec'd from a thread", pid)
		}
		if e.Kind == ProcessExec {
			execs++
		}
	}
	if execs != 1 {
		t.Errorf("%d exec events for pid %d, want 1", execs, pid)
	}
	shell := 0
	for _, smp := range rec.samples {
		if smp.PID == pid && smp.Comm == "sh" {
			shell++
		}
	}
	if shell < 20 {
		t.Errorf("%d samples of the exec'd shell in 1 s at 199 Hz", shell)
	}
}

// A Go binary's runtime layout lives and goes with its table.
func TestGoRuntimeFollowsTable(t *testing.T) {
	testenv.RequireRoot(t)
	s, err := Load(Config{Frequency: 19})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer s.Close()
	rows := []UnwindRow{{Pc: 0, CfaRule: CFAFramePointer}, {Pc: 0x1000, CfaRule: CFAGo, CfaReg: GoFuncSystemstack}}
	goID, err := s.AddTable(RowsOf(rows), &GoRuntime{TlsG: -8, G_m: 48, G_sched: 56, M_curg: 184})
	if err != nil {
		t.Fatal(err)
	}
	cID, err := s.AddTable(RowsOf(rows[:1]), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := s.KernelState(); err != nil || st.Tables != 2 || st.GoRuntimes != 1 {
		t.Fatalf("after adding a Go table and another: %+v, %v", st, err)
	}
	var g GoRuntime
	if err := s.objs.GoRuntimes.Lookup(goID, &g); err != nil || g.M_curg != 184 || g.TlsG != -8 {
		t.Fatalf("layout of table %d: %+v, %v", goID, g, err)
	}
	for _, id := range []uint32{goID, cID} {
		if err := s.RemoveTable(id); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := s.KernelState(); err != nil || st.Tables != 0 || st.GoRuntimes != 0 {
		t.Fatalf("after removing both: %+v, %v", st, err)
	}
}

// TestSetProcessNumbersEachWriting holds SetProcess to what the walkers' memo of rows
// (types.h, struct row_memo) relies on: every writing of a process's mappings carries a
// number no earlier writing had, never 0, so that what a walk remembers from the mappings
// before is not taken for what the new ones say.
func TestSetProcessNumbersEachWriting(t *testing.T) {
	testenv.RequireRoot(t)
	s, err := Load(Config{Frequency: 19})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer s.Close()
	seen := map[uint32]bool{}
	maps := []ExecMapping{{Start: 0x400000, End: 0x401000}}
	for i := range 4 {
		pid := uint32(1<<22 + i%2) // beyond pid_max's default: no real process
		if err := s.SetProcess(pid, 7, maps); err != nil {
			t.Fatal(err)
		}
		var info samplerProcInfo
		if err := s.objs.ProcMaps.Lookup(pid, &info); err != nil {
			t.Fatal(err)
		}
		if info.Gen == 0 || seen[info.Gen] {
			t.Fatalf("writing %d of pid %d numbered %d; numbers before: %v", i, pid, info.Gen, seen)
		}
		seen[info.Gen] = true
	}
}

// A table handed over in parts is the table in the kernel, rows then index, and one whose
// parts do not add up to what it said is refused without taking a slot.
func TestAddTableInParts(t *testing.T) {
	testenv.RequireRoot(t)
	s, err := Load(Config{Frequency: 19})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer s.Close()
	rnd := rand.New(rand.NewPCG(3, 45))
	rows := make([]UnwindRow, 5000)
	pc := uint32(0x1000)
	for i := range rows {
		rows[i] = UnwindRow{Pc: pc, CfaRule: CFASP, CfaOffset: int32(8 * (1 + rnd.IntN(8)))}
		pc += 1 + rnd.Uint32N(64)
	}
	inParts := func(n, part int) TableRows {
		t := RowsOf(rows)
		t.Each = func(write func([]UnwindRow) error) error {
			for at := 0; at < n; at += part {
				if err := write(rows[at:min(at+part, n)]); err != nil {
					return err
				}
			}
			return nil
		}
		return t
	}
	id, err := s.AddTable(inParts(len(rows), 777), nil)
	if err != nil {
		t.Fatal(err)
	}
	var innerID ebpf.MapID
	if err := s.objs.UnwindTables.Lookup(id, &innerID); err != nil {
		t.Fatal(err)
	}
	inner, err := ebpf.NewMapFromID(innerID)
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	want := append(slices.Clone(rows), rowIndex(rows)...)
	if inner.MaxEntries() != uint32(len(want)) {
		t.Fatalf("the kernel's table has room for %d rows; want %d", inner.MaxEntries(), len(want))
	}
	for k := range want {
		var got UnwindRow
		if err := inner.Lookup(uint32(k), &got); err != nil || got != want[k] {
			t.Fatalf("row %d in the kernel: %+v, %v; want %+v", k, got, err, want[k])
		}
	}
	for _, bad := range []TableRows{inParts(len(rows)-1, 777), func() TableRows { t := inParts(len(rows), 777); t.Len--; return t }()} {
		if _, err := s.AddTable(bad, nil); err == nil {
			t.Errorf("a table of %d rows said to have %d was taken", len(rows), bad.Len)
		}
	}
	if st, err := s.KernelState(); err != nil || st.Tables != 1 {
		t.Errorf("after one table taken and two refused: %+v, %v", st, err)
	}
}
