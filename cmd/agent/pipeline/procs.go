package pipeline

import (
	"os"
	"runtime"
)

// eventsPerProc is the rate of kernel events (stacks sampled or walked off-CPU) that
// one thread running Go code carries. sonde spends about 15 µs an event in all (3 % of a
// core at 999 Hz on two CPUs, BenchmarkAgentOverhead): 4000 a second keep a thread busy
// 6 % of the time, with room for an interval's naming and a new program's tables.
const eventsPerProc = 4000

// procsFor is how many threads run sonde's Go code at once (GOMAXPROCS) for frequency
// on cpus, with offCPUWalks the switch-outs each CPU walks a second when off-CPU stacks
// are recorded (0: not recorded, less than 0: every one, unbounded), at most avail.
//
// One, unless the events need more. With a second thread, each goroutine woken while
// another runs (a process read, an exec's grace ending, the ring's poll) starts a thread
// spinning for work: under 120 execs a second, one thread cut sonde's steady CPU by a
// sixth to a quarter, run beside the default in the same minutes (2026-11-29).
func procsFor(frequency, cpus, offCPUWalks, avail int) int {
	if offCPUWalks < 0 {
		return avail
	}
	events := max(cpus, 1) * (max(frequency, 0) + offCPUWalks)
	return max(1, min(avail, (events+eventsPerProc-1)/eventsPerProc))
}

// setProcs sets GOMAXPROCS for the run unless the environment sets it.
func setProcs(cfg *Config, cpus int) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	walks := 0
	if cfg.OffCPU {
		walks = offCPUWalks(cfg.OffCPURate)
	}
	runtime.GOMAXPROCS(procsFor(cfg.Frequency, cpus, walks, runtime.GOMAXPROCS(0)))
}
