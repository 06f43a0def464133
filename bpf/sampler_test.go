package bpf

import (
	"context"
	"os/exec"
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

// A Go binary's runtime layout lives and goes with its table.
func TestGoRuntimeFollowsTable(t *testing.T) {
	testenv.RequireRoot(t)
	s, err := Load(Config{Frequency: 19})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer s.Close()
	rows := []UnwindRow{{Pc: 0, CfaRule: CFAFramePointer}, {Pc: 0x1000, CfaRule: CFAGo, CfaReg: GoFuncSystemstack}}
	goID, err := s.AddTable(rows, &GoRuntime{TlsG: -8, G_m: 48, G_sched: 56, M_curg: 184})
	if err != nil {
		t.Fatal(err)
	}
	cID, err := s.AddTable(rows[:1], nil)
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
