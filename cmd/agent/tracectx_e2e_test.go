package main

import (
	"bufio"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
)

// startUntilReady starts a workload that prints "ready" once set up, killed when b ends.
func startUntilReady(b testing.TB, cmd *exec.Cmd) int {
	b.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "ready" {
		b.Fatalf("%s did not say ready", cmd.Path)
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return cmd.Process.Pid
}

// BenchmarkTraceContext measures what reading trace contexts adds to the BPF program's
// time per sample: ctx-ns/sample is timed inside the program around the context read
// (--bpf-stats), bpf-ns/sample is the whole program's (bpf_stats), for the same workloads
// sampled with --trace-context on and off.
// otel publishes an OpenTelemetry thread context (its variable in the executable), none is
// the same program publishing nothing (a hash miss in the kernel), go a Go program whose
// goroutines carry pprof labels, go-nolabels the same program without labels (the pointer
// chase up to an empty label set).
func BenchmarkTraceContext(b *testing.B) {
	testenv.RequireRoot(b)
	cBin := testprog.BuildThreadContext(b, "exe")
	goBin := testprog.BuildGoLabels(b, "local")
	workloads := []struct {
		name string
		cmd  func() *exec.Cmd
	}{
		{"otel", func() *exec.Cmd { return exec.Command(cBin, "60", "bench", "tls_v1") }},
		{"none", func() *exec.Cmd { return exec.Command(cBin, "60", "bench", "none") }},
		{"go", func() *exec.Cmd { return exec.Command(goBin, "60s") }},
		{"go-nolabels", func() *exec.Cmd { return exec.Command(goBin, "60s", "none") }},
	}
	for _, w := range workloads {
		for _, on := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/context=%v", w.name, on), func(b *testing.B) {
				pid := startUntilReady(b, w.cmd())
				for b.Loop() {
					ns, stderr := bpfStats(b, pid, "--trace-context="+strconv.FormatBool(on))
					b.ReportMetric(ns, "bpf-ns/sample")
					if on {
						// Timed inside the program around the context read alone: what
						// it adds, apart from the noise of the whole sample's cost.
						c := regexp.MustCompile(`kernel\.context\.ns_per_sample=(\d+)`).FindStringSubmatch(stderr)
						if c == nil {
							b.Fatalf("no context timing in:\n%s", stderr)
						}
						ctxNs, _ := strconv.ParseFloat(c[1], 64)
						b.ReportMetric(ctxNs, "ctx-ns/sample")
					}
					linked := regexp.MustCompile(`linked=(\d+)`).FindStringSubmatch(stderr)
					if on && (w.name == "otel" || w.name == "go") && (linked == nil || linked[1] == "0") {
						b.Fatalf("no sample linked:\n%s", stderr)
					}
				}
			})
		}
	}
}
