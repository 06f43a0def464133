package pipeline

import (
	"fmt"
	"runtime"
	"time"

	"github.com/sonde-profiler/sonde/bpf"
)

// idleShare is the share of the host's CPU time below which a host-wide run is called
// idle: an idle host's profile is a handful of stacks of sonde, the shell and the kernel,
// which tells a newcomer nothing and looks like a fault.
const idleShare = 0.05

// idleNote is the line a host-wide run adds under its top table and to its flame graph
// when the host was nearly idle, pointing at the ways to profile a program; "" otherwise,
// and for runs that name their targets (--pid, --cgroup, a pod filter, sonde record),
// whose emptiness sonde reports as it is.
func idleNote(hostWide bool, samples int64, period, span time.Duration, cpus int) string {
	if !hostWide || period <= 0 || span <= 0 || cpus <= 0 {
		return ""
	}
	busy := time.Duration(samples) * period
	share := float64(busy) / (float64(span) * float64(cpus))
	if share >= idleShare {
		return ""
	}
	return fmt.Sprintf("The host was nearly idle: its %d CPUs were busy %.1f%% of the %.1fs. To profile a program, run it under `sonde record -- COMMAND`, or attach to it with `sonde --pid PID`.",
		cpus, 100*share, span.Seconds())
}

// hostWide reports whether the run samples every process of the host.
func (c *Config) hostWide() bool {
	return len(c.PIDs) == 0 && !c.FollowForks && len(c.Kube.Cgroups) == 0 && !c.Kube.FilterByPod
}

// hostCPUs is the number of CPUs sampling covers: the online ones.
func hostCPUs() int {
	if cpus, err := bpf.OnlineCPUs(); err == nil && len(cpus) > 0 {
		return len(cpus)
	}
	return runtime.NumCPU()
}

// hostExecGrace is how long a host-wide run waits after an exec before it reads the
// process: /bin/true, sh -c and exec probes are gone by then, and a program that runs on
// is read 20 ms into its life, its libraries mapped.
const hostExecGrace = 20 * time.Millisecond

// execGrace is the grace before a process is read at its exec (trace.ProcessConfig).
func execGrace(c *Config) time.Duration {
	if c.hostWide() {
		return hostExecGrace
	}
	return 0
}
