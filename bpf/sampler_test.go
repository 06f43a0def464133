package bpf

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"

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
	time.Sleep(time.Second)
	busy.Process.Kill()
	busy.Wait()
	time.Sleep(100 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}

	if len(rec.samples) < 50 {
		t.Fatalf("got %d samples of a busy process in 1 s at 199 Hz, want at least 50", len(rec.samples))
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
	st, err := s.ProgramStats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Runs == 0 || st.Runtime <= 0 {
		t.Errorf("program stats %+v: want runs and runtime", st)
	}
	t.Logf("%d samples, %d runs, %v per run", len(rec.samples), st.Runs, st.Runtime/time.Duration(st.Runs))
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
