package trace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
)

// TestExecGrace: with a grace, an exec'd process that is gone when the grace ends is never
// read, one still there is read then, and one sampled first is read at its sample.
func TestExecGrace(t *testing.T) {
	bin := testprog.BuildC(t, helloC, "-O1")
	var st syscall.Stat_t
	syscall.Stat(bin, &st)
	procfs := filepath.Join(t.TempDir(), "proc")
	line := fmt.Sprintf("1000-2000 r-xp 00000000 %02x:%02x %d %s\n", unixMajor(st.Dev), unixMinor(st.Dev), st.Ino, bin)
	for _, pid := range []int{7, 8, 9} {
		fakeProc(t, procfs, pid, "p", bin, line)
	}
	// Long enough that the checks before it ends run in time on a busy machine.
	const grace = 3 * time.Second
	now := time.Now()
	c, procs := newAggregator(t, ProcessConfig{ProcFS: procfs, ExecGrace: grace}, Config{}, now)

	procs.Exec(7, 1) // gone within the grace
	procs.Exec(8, 1) // lives on
	procs.Exec(9, 1) // sampled at once
	if err := os.RemoveAll(filepath.Join(procfs, "7")); err != nil {
		t.Fatal(err)
	}
	procs.Exit(7)
	c.Add(RawSample{PID: 9, TID: 9, ExecID: 1, Comm: "p", Time: now, User: []uint64{0x1010}})
	procs.Settle(context.Background())
	if s := procs.Stats(); s.MapsReads != 1 {
		t.Fatalf("%d reads before the grace ended, want the sampled process's only: %+v", s.MapsReads, s)
	}
	testenv.WaitFor(t, "the grace to end and the living process to be read", 10*time.Second, func() (bool, string) {
		procs.Settle(context.Background())
		s := procs.Stats()
		return s.MapsReads == 2 && s.ExecGraceSkipped == 2, fmt.Sprintf("%+v", s)
	})
	if procs.Process(8) == nil || procs.Process(7) != nil && procs.Process(7).Name != "" {
		t.Errorf("process 8 %v, process 7 %v: want 8 read and 7 never", procs.Process(8), procs.Process(7))
	}
}
