package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/trace"
)

// groupFrequency is the rate a group is sampled at: five times the --pid default, so that
// a dozen processes sharing two cores each reach their samples in a few seconds of the
// machine's time. The assertions are shares of samples, which the rate does not change.
const groupFrequency = 1999

// group is a set of workloads that one sonde profiles at once, each case of a test being one
// of its processes: sonde's start, the kernel's programs' load and the wait for samples are
// paid once for all the cases instead of once each, and the cases share the machine as a
// busy host's processes do. Each process's samples are told apart by PID.
type group struct {
	t    *testing.T
	cmds []*exec.Cmd
	pids []int
}

// startGroup starts every command at once and waits until each has used warm of CPU (past
// its start-up, its hot code compiled where a runtime compiles) and, where ready is not
// empty, has written that line on its standard output. Their CPU times add up on the
// machine's cores, so a group of ten waits about as long as five single runs' warm-up.
func startGroup(t *testing.T, warm time.Duration, ready string, cmds ...*exec.Cmd) *group {
	t.Helper()
	sonde(t) // built before the workloads start, whose seconds must not run out meanwhile
	t0 := time.Now()
	defer func() { t.Logf("%d workloads warm after %v", len(cmds), time.Since(t0).Round(10*time.Millisecond)) }()
	g := &group{t: t, cmds: cmds}
	var readied atomic.Int64
	for _, cmd := range cmds {
		var out io.ReadCloser
		if ready != "" {
			var err error
			if out, err = cmd.StdoutPipe(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %v: %v", cmd.Args, err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		pid, err := testenv.ProgramPID(cmd)
		if err != nil {
			t.Fatal(err)
		}
		g.pids = append(g.pids, pid)
		if out != nil {
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					if sc.Text() == ready {
						readied.Add(1)
						break
					}
				}
				io.Copy(io.Discard, out) // the rest, so that the workload never blocks on a full pipe
			}()
		}
	}
	// All at once: the machine's time is shared between them, so the longest wait bounds
	// the group's and one busy process cannot time out the others' waits.
	testenv.WaitFor(t, fmt.Sprintf("%d workloads to use %v of CPU each", len(cmds), warm), testenv.SampleTimeout, func() (bool, string) {
		var behind []string
		for _, pid := range g.pids {
			used, err := testenv.ProcessCPU(pid)
			if err != nil {
				return false, err.Error()
			}
			if used < warm {
				behind = append(behind, fmt.Sprintf("%d at %v", pid, used))
			}
		}
		if ready != "" && readied.Load() < int64(len(cmds)) {
			behind = append(behind, fmt.Sprintf("%d of %d wrote %q", readied.Load(), len(cmds), ready))
		}
		return len(behind) == 0, strings.Join(behind, ", ")
	})
	return g
}

// groupProfile is what one sonde recorded of a group, in OTLP (which keeps each location's
// frame type) and pprof.
type groupProfile struct {
	g      *group
	otlp   []*trace.Profile
	pprof  *profile.Profile
	stderr string
}

// profile runs one sonde on the group's processes at groupFrequency until every process has
// run long enough for perProcess samples and sonde has recorded that many for each on
// average, then stops it and reads its outputs. extra adds flags.
func (g *group) profile(perProcess int, extra ...string) *groupProfile {
	t := g.t
	t.Helper()
	var pids []string
	for _, pid := range g.pids {
		pids = append(pids, strconv.Itoa(pid))
	}
	dir := t.TempDir()
	otlpOut, pprofOut := filepath.Join(dir, "p.otlp.pb"), filepath.Join(dir, "p.pb.gz")
	args := append([]string{"--pid", strings.Join(pids, ","), "--frequency", strconv.Itoa(groupFrequency),
		"--output", otlpOut, "--output", pprofOut, "--top", "0"}, extra...)
	// sonde starts while the workloads wait: its start would otherwise share the cores
	// with all of them, and take a dozen times as long.
	g.signal(syscall.SIGSTOP)
	s := testenv.StartSonde(t, sonde(t), args...)
	t0 := time.Now()
	// Ready: sampling, and every process read and its mappings in the kernel.
	ready := s.WaitReady() && s.WaitUntil(fmt.Sprintf("%d processes tracked", len(g.pids)), func() (bool, string) {
		tracked, err1 := s.Metric("sonde_processes")
		inKernel, err2 := s.Metric(`sonde_bpf_map_entries{map="proc_maps"}`)
		if err := errors.Join(err1, err2); err != nil {
			return false, err.Error()
		}
		return tracked >= float64(len(g.pids)) && inKernel >= float64(len(g.pids)), fmt.Sprintf("%v tracked, %v in the kernel", tracked, inKernel)
	})
	sampling := time.Now()
	// A process's samples are its CPU time at the sampling rate: waiting for each process's
	// time, not only the total, gives each its share however the scheduler spreads them.
	from := make([]time.Duration, len(g.pids))
	for i, pid := range g.pids {
		from[i], _ = testenv.ProcessCPU(pid)
	}
	g.signal(syscall.SIGCONT)
	need := time.Duration(float64(perProcess) * 1.1 / groupFrequency * float64(time.Second))
	want := float64(perProcess * len(g.pids))
	ok := ready && s.WaitUntil(fmt.Sprintf("%v samples, and %v of CPU in each of %d processes", want, need, len(g.pids)), func() (bool, string) {
		var behind []string
		for i, pid := range g.pids {
			used, err := testenv.ProcessCPU(pid)
			if err != nil {
				return false, fmt.Sprintf("process %d: %v", pid, err)
			}
			if used-from[i] < need {
				behind = append(behind, fmt.Sprintf("%d at %v", pid, used-from[i]))
			}
		}
		n, err := s.Metric("sonde_samples_total")
		if err != nil {
			return false, err.Error()
		}
		return len(behind) == 0 && n >= want, fmt.Sprintf("%v samples; behind: %s", n, strings.Join(behind, ", "))
	})
	t.Logf("sonde ready after %v, sampled for %v", sampling.Sub(t0).Round(10*time.Millisecond), time.Since(sampling).Round(10*time.Millisecond))
	// Likewise its last naming of what it sampled, which reads from the processes.
	g.signal(syscall.SIGSTOP)
	r := s.Stop()
	if !ok || r.Err != nil {
		t.Fatalf("sonde exited before the group had its samples: %v\n%s", r.Err, r.Stderr)
	}
	profiles, err := otlp.ReadFile(otlpOut)
	if err != nil {
		t.Fatal(err)
	}
	return &groupProfile{g: g, otlp: profiles, pprof: readProfile(t, pprofOut), stderr: r.Stderr}
}

// signal sends sig to every process of the group.
func (g *group) signal(sig syscall.Signal) {
	for _, pid := range g.pids {
		syscall.Kill(pid, sig)
	}
}

// samples are the OTLP samples of the group's i-th process.
func (p *groupProfile) samples(i int) []*trace.Sample {
	pid := uint32(p.g.pids[i])
	var out []*trace.Sample
	for _, pr := range p.otlp {
		for _, s := range pr.Samples {
			if s.Process != nil && s.Process.PID == pid {
				out = append(out, s)
			}
		}
	}
	return out
}

// profileOf is the pprof profile of the group's i-th process alone.
func (p *groupProfile) profileOf(i int) *profile.Profile {
	pid := int64(p.g.pids[i])
	one := p.pprof.Copy()
	one.Sample = slices.DeleteFunc(one.Sample, func(s *profile.Sample) bool {
		v := s.NumLabel["pid"]
		return len(v) != 1 || v[0] != pid
	})
	return one
}

// count is the number of samples in ss.
func count(ss []*trace.Sample) int64 {
	var n int64
	for _, s := range ss {
		n += s.Count
	}
	return n
}
