package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/profiles/v1development"
	"google.golang.org/grpc"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
)

// cpuStat is the host's CPU time since boot, in ticks, from /proc/stat's first line.
type cpuStat struct{ busy, idle, steal uint64 }

func readCPUStat(b testing.TB) cpuStat {
	b.Helper()
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		b.Fatalf("/proc/stat begins %q", line)
	}
	var v [8]uint64 // user nice system idle iowait irq softirq steal
	for i := range v {
		v[i], _ = strconv.ParseUint(f[i+1], 10, 64)
	}
	return cpuStat{busy: v[0] + v[1] + v[2] + v[5] + v[6], idle: v[3] + v[4], steal: v[7]}
}

// reportHostLoad puts beside a benchmark's figures how busy the machine was since from:
// the share of its CPU time not idle (the benchmark's own workloads included), the share
// the hypervisor took (steal), and the load average at the end. Memory and CPU figures
// from a machine with other work on it read differently from a quiet one's.
func reportHostLoad(b *testing.B, from cpuStat) {
	b.Helper()
	to := readCPUStat(b)
	busy, idle, steal := to.busy-from.busy, to.idle-from.idle, to.steal-from.steal
	if total := busy + idle + steal; total > 0 {
		b.ReportMetric(100*float64(busy)/float64(total), "host-busy-%")
		b.ReportMetric(100*float64(steal)/float64(total), "steal-%")
	}
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(data)); len(f) > 0 {
			if load, err := strconv.ParseFloat(f[0], 64); err == nil {
				b.ReportMetric(load, "load1")
			}
		}
	}
}

// receiver is an OTLP profiles endpoint that takes every request and notes when the
// first came: the benchmarks measure sonde, not a collector.
type receiver struct {
	collectorpb.UnimplementedProfilesServiceServer
	addr  string
	mu    sync.Mutex
	first time.Time
}

func startReceiver(b testing.TB) *receiver {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	r := &receiver{addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(64 << 20))
	collectorpb.RegisterProfilesServiceServer(srv, r)
	go srv.Serve(lis)
	b.Cleanup(srv.Stop)
	return r
}

func (r *receiver) Export(context.Context, *collectorpb.ExportProfilesServiceRequest) (*collectorpb.ExportProfilesServiceResponse, error) {
	r.mu.Lock()
	if r.first.IsZero() {
		r.first = time.Now()
	}
	r.mu.Unlock()
	return &collectorpb.ExportProfilesServiceResponse{}, nil
}

func (r *receiver) firstAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.first
}

// BenchmarkAgentOverhead measures what sonde costs while both cores are busy, host-wide
// and exporting to an OTLP endpoint every 2 s: the BPF program's time per sample
// (bpf_stats), sonde's CPU share of one core in steady state (a 10 s window after
// start-up) and over the whole run (start-up and final symbolization included), RSS at
// the end of the window and at its peak, the samples the ring buffer lost, the encoded
// OTLP bytes per sample delivered, and the time from start to the first sample and to
// the first report.
func BenchmarkAgentOverhead(b *testing.B) {
	testenv.RequireRoot(b)
	bin := buildWorkload(b, "chain", chainC, "-O2", "-fno-omit-frame-pointer")
	sonde(b) // built once, before any clock starts
	for _, hz := range []int{19, 999} {
		b.Run(fmt.Sprintf("%dHz", hz), func(b *testing.B) {
			for range 2 {
				startWorkload(b, bin, 60)
			}
			warmup, window := benchSpan(5*time.Second, time.Second), benchSpan(10*time.Second, 2*time.Second)
			secs := int((warmup + window).Seconds()) + 1
			for b.Loop() {
				host := readCPUStat(b)
				rcv := startReceiver(b)
				start := time.Now()
				a := startAgent(b, "--duration", fmt.Sprintf("%ds", secs), "--frequency", strconv.Itoa(hz), "--interval", "2s",
					"--bpf-stats", "--otlp-endpoint", rcv.addr, "--otlp-insecure")
				var firstSample time.Duration
				for firstSample == 0 && time.Since(start) < time.Duration(secs)*time.Second {
					if a.metrics(b)["sonde_samples_total"] > 0 {
						firstSample = time.Since(start)
					}
					time.Sleep(20 * time.Millisecond)
				}
				time.Sleep(max(0, warmup-time.Since(start)))
				before := cpuTime(b, a.cmd.Process.Pid)
				time.Sleep(window)
				steady := cpuTime(b, a.cmd.Process.Pid) - before
				rss, err := statusKiB(a.cmd.Process.Pid, "VmRSS")
				if err != nil {
					b.Fatal(err)
				}
				if err := <-a.done; err != nil {
					a.done <- err
					b.Fatalf("sonde: %v\n%s", err, a.stderr.String())
				}
				a.done <- nil
				ru := a.cmd.ProcessState.SysUsage().(*syscall.Rusage)
				total := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
				log := a.stderr.String()
				samples := summaryCount(b, log, "sent_samples")
				if firstSample == 0 || samples == 0 || rcv.firstAt().IsZero() {
					b.Fatalf("no samples delivered (first sample after %v):\n%s", firstSample, log)
				}
				b.ReportMetric(float64(summaryCount(b, log, "kernel.bpf_ns_per_sample")), "bpf-ns/sample")
				b.ReportMetric(100*steady.Seconds()/window.Seconds(), "steady-cpu-%")
				b.ReportMetric(100*total.Seconds()/float64(secs), "run-cpu-%")
				b.ReportMetric(float64(rss)/1024, "rss-MiB")
				b.ReportMetric(float64(ru.Maxrss)/1024, "peak-rss-MiB")
				b.ReportMetric(float64(summaryCount(b, log, "kernel.ring_buffer_full")), "lost-samples")
				b.ReportMetric(float64(summaryCount(b, log, "sent_bytes"))/float64(samples), "otlp-B/sample")
				b.ReportMetric(firstSample.Seconds()*1000, "first-sample-ms")
				b.ReportMetric(rcv.firstAt().Sub(start).Seconds()*1000, "first-report-ms")
				reportHostLoad(b, host)
			}
		})
	}
}

// BenchmarkNodeMemory measures sonde's memory host-wide with full symbolization in the
// scenarios a node agent is provisioned for: a C program without frame pointers and a
// Go program busy on both cores at 20 Hz; the same at 99 Hz with 300 fork+exec a second
// beside; and at 99 Hz while the Go toolchain rebuilds a program from scratch (large Go
// and C binaries to name). It reports the peak RSS and the RSS after one minute.
func BenchmarkNodeMemory(b *testing.B) {
	testenv.RequireRoot(b)
	minute := benchSpan(time.Minute, 3*time.Second)
	busy := func(b *testing.B) {
		c := buildWorkload(b, "cbusy", cbusyC, "-O2", "-fomit-frame-pointer")
		startWorkload(b, c, 3600)
		g := exec.Command(testprog.BuildGo(b, busyGo))
		if err := g.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { g.Process.Kill(); g.Wait() })
	}
	scenarios := []struct {
		name  string
		hz    int
		setup func(b *testing.B)
	}{
		{"busy-20Hz", 20, busy},
		{"busy-forkexec300-99Hz", 99, func(b *testing.B) {
			busy(b)
			churn := buildWorkload(b, "churn", churnC, "-O2")
			short := buildWorkload(b, "short", "int main(void){volatile unsigned long a=0;for(int i=0;i<100000;i++)a+=i;return 0;}\n", "-O1")
			cmd := exec.Command(churn, "300", "3600", short)
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		}},
		// A busy Node.js beside them: node's 100 MB executable and its symbol table
		// are what sonde reads for it.
		{"busy-node-20Hz", 20, func(b *testing.B) {
			busy(b)
			node := testenv.Nodes(b)[0]
			cmd := exec.Command(node.Path, nodeWorkload(b), "chain", "3600")
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		}},
		// A busy JVM beside them: libjvm.so's unwind table and symbols.
		{"busy-jvm-20Hz", 20, func(b *testing.B) {
			busy(b)
			jdk := testenv.JDKs[0]
			testenv.RequireJDK(b, jdk)
			dir := b.TempDir()
			src, err := filepath.Abs("../../interp/jvm/testdata/SondeChain.java")
			if err != nil {
				b.Fatal(err)
			}
			if out, err := exec.Command(jdk.Javac(), "-d", dir, src).CombinedOutput(); err != nil {
				b.Fatalf("javac: %v\n%s", err, out)
			}
			cmd := exec.Command(jdk.Java(), "-cp", dir, "SondeChain")
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		}},
		// A JVM with more than 50 MB of compiled code, a Spring-sized service's: Java
		// frames walked and named at 99 Hz across thousands of methods.
		{"bigjvm-99Hz", 99, func(b *testing.B) { startBigJVM(b, uint64(benchSpan(50<<20, 2<<20))) }},
		{"gobuild-99Hz", 99, func(b *testing.B) {
			dir := b.TempDir()
			src := filepath.Join(dir, "main.go")
			if err := os.WriteFile(src, []byte(busyGo), 0o644); err != nil {
				b.Fatal(err)
			}
			// -a rebuilds the standard library too; a private cache keeps the machine's
			// own from being wiped or reused.
			cmd := exec.Command("go", "build", "-a", "-o", filepath.Join(dir, "prog"), src)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "GOCACHE="+filepath.Join(dir, "cache"))
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		}},
	}
	for _, sc := range scenarios {
		b.Run(sc.name, func(b *testing.B) {
			for b.Loop() {
				sc.setup(b)
				host := readCPUStat(b)
				a := startAgent(b, "--frequency", strconv.Itoa(sc.hz), "--interval", "10s")
				time.Sleep(minute)
				atMinute, err := statusKiB(a.cmd.Process.Pid, "VmRSS")
				if err != nil {
					b.Fatal(err)
				}
				peak, err := statusKiB(a.cmd.Process.Pid, "VmHWM")
				if err != nil {
					b.Fatal(err)
				}
				a.stop(b)
				b.ReportMetric(float64(peak)/1024, "peak-rss-MiB")
				b.ReportMetric(float64(atMinute)/1024, "rss-1min-MiB")
				reportHostLoad(b, host)
			}
		})
	}
}

// switchStormC ping-pongs a byte between two threads over pipes: every hop is a thread
// going off the CPU to wait, tens of thousands a second per pair.
const switchStormC = `#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static int a[2], b[2];
static double secs;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
static void *echo(void *x){char c; while(read(a[0],&c,1)==1) if(write(b[1],&c,1)!=1) break; return 0;}
int main(int argc,char**argv){secs=atof(argv[1]); if(pipe(a)||pipe(b)) return 1; pthread_t t; pthread_create(&t,0,echo,0);
  double end=now()+secs; char c='x'; while(now()<end){ for(int i=0;i<1000;i++){ if(write(a[1],&c,1)!=1||read(b[0],&c,1)!=1) return 1; } }
  close(a[1]); pthread_join(t,0); return 0;}
`

// BenchmarkOffCPUStorm measures what --off-cpu costs host-wide beside a context-switch
// storm (two processes ping-ponging over pipes): sonde's own CPU and the kernel programs'
// (the sampler's and the off-CPU program at every switch), as a share of one core, its RSS,
// and the switch rate, with off-CPU off and on.
func BenchmarkOffCPUStorm(b *testing.B) {
	testenv.RequireRoot(b)
	bin := buildWorkload(b, "storm", switchStormC, "-O2", "-pthread")
	sonde(b)
	for _, off := range []bool{false, true} {
		b.Run(fmt.Sprintf("off-cpu=%v", off), func(b *testing.B) {
			warmup, window := benchSpan(4*time.Second, time.Second), benchSpan(10*time.Second, 2*time.Second)
			for b.Loop() {
				// The storm lasts until the benchmark ends it; sonde runs until it is told to
				// stop after the window, however long it took to start.
				for range 2 {
					startWorkload(b, bin, 600)
				}
				args := []string{"--frequency", "19", "--interval", "2s", "--bpf-stats"}
				if off {
					args = append(args, "--off-cpu")
				}
				start := time.Now()
				a := startAgent(b, args...)
				a.waitMetrics(b, "samples to flow", func(m map[string]float64) bool { return m["sonde_samples_total"] > 0 })
				time.Sleep(warmup)
				before, m0 := cpuTime(b, a.cmd.Process.Pid), a.metrics(b)
				time.Sleep(window)
				steady, m1 := cpuTime(b, a.cmd.Process.Pid)-before, a.metrics(b)
				rss, err := statusKiB(a.cmd.Process.Pid, "VmRSS")
				if err != nil {
					b.Fatal(err)
				}
				a.stop(b)
				secs := time.Since(start).Seconds()
				log := a.stderr.String()
				bpfNs := summaryCountOr0(log, "kernel.bpf_offcpu_ns") + summaryCount(b, log, "kernel.bpf_ns_per_sample")*summaryCount(b, log, "kernel.samples")
				b.ReportMetric(100*steady.Seconds()/window.Seconds(), "sonde-cpu-%")
				b.ReportMetric(100*float64(bpfNs)/1e9/secs, "bpf-cpu-%")
				b.ReportMetric(float64(rss)/1024, "rss-MiB")
				b.ReportMetric(float64(summaryCountOr0(log, "kernel.bpf_offcpu_ns_per_run")), "bpf-ns/switch")
				waits := func(m map[string]float64) float64 {
					return m[`sonde_offcpu_switches_total{outcome="walked"}`] + m[`sonde_offcpu_switches_total{outcome="skipped"}`]
				}
				b.ReportMetric((waits(m1)-waits(m0))/window.Seconds(), "waits/s")
				runs := summaryCountOr0(log, "kernel.bpf_offcpu_runs")
				b.ReportMetric(float64(runs)/secs, "switches/s")
				if runs > 0 {
					// What 100 000 switches a second cost, the program's and sonde's together.
					perSwitch := (float64(summaryCountOr0(log, "kernel.bpf_offcpu_ns")) + steady.Seconds()*1e9*secs/window.Seconds()) / float64(runs)
					b.ReportMetric(100*perSwitch*1e5/1e9, "cpu-%-at-100k/s")
				}
				b.ReportMetric(float64(summaryCount(b, log, "kernel.ring_buffer_full")+summaryCountOr0(log, "kernel.off_cpu.lost")), "lost")
			}
		})
	}
}

// summaryCountOr0 is summaryCount for a key the summary leaves out when it is zero.
func summaryCountOr0(stderr, key string) int64 {
	m := regexp.MustCompile(`\b` + regexp.QuoteMeta(key) + `=(\d+)`).FindStringSubmatch(stderr)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// startBigJVM generates a Java program of 500 classes (20 with -short) of two dozen methods each, runs it
// on JDK 17 with default flags until its code cache holds at least want bytes of compiled
// code (C1 compiles it all at about half a megabyte a second here), and reports how much
// it holds.
func startBigJVM(b *testing.B, want uint64) {
	jdk := testenv.JDKs[0]
	testenv.RequireJDK(b, jdk)
	dir := b.TempDir()
	const methods, statements = 24, 40
	classes := 500
	if testing.Short() {
		classes = 20
	}
	var srcs []string
	for c := range classes {
		var w strings.Builder
		fmt.Fprintf(&w, "public class G%d {\n", c)
		for m := range methods {
			fmt.Fprintf(&w, "  static long m%d(long x) {\n    long y = x ^ %dL;\n", m, c*methods+m)
			for k := range statements {
				fmt.Fprintf(&w, "    if ((y & %d) != 0) y = y * %d + (x >>> %d); else y = y ^ (y << %d) ^ %d;\n", 1<<(k%8), k+3, k%60+1, k%5+1, k*7919+c)
			}
			w.WriteString("    return y;\n  }\n")
		}
		w.WriteString("  static long all(long x) {\n")
		for m := range methods {
			fmt.Fprintf(&w, "    x += m%d(x);\n", m)
		}
		w.WriteString("    return x;\n  }\n}\n")
		srcs = append(srcs, filepath.Join(dir, fmt.Sprintf("G%d.java", c)))
		if err := os.WriteFile(srcs[c], []byte(w.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	var w strings.Builder
	w.WriteString("public class Big {\n  public static void main(String[] a) {\n    long x = 1;\n    while (true) {\n")
	for c := range classes {
		fmt.Fprintf(&w, "      x += G%d.all(x);\n", c)
	}
	w.WriteString("    }\n  }\n}\n")
	srcs = append(srcs, filepath.Join(dir, "Big.java"))
	if err := os.WriteFile(srcs[len(srcs)-1], []byte(w.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command(jdk.Javac(), append([]string{"-d", dir}, srcs...)...).CombinedOutput(); err != nil {
		b.Fatalf("javac: %v\n%s", err, out)
	}
	cmd := exec.Command(jdk.Java(), "-cp", dir, "Big")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var used uint64
	testenv.WaitFor(b, fmt.Sprintf("%d MiB of compiled code", want>>20), 8*time.Minute, func() (bool, string) {
		var err error
		if used, err = compiledBytes(jdk, cmd.Process.Pid); err != nil {
			return false, err.Error()
		}
		return used >= want, fmt.Sprintf("%d MiB", used>>20)
	})
	b.ReportMetric(float64(used)/(1<<20), "jvm-code-MiB")
}

// compiledBytes is how much of a JVM's code cache its compiled methods take, as its
// nmethod heaps' used sizes (jcmd Compiler.codecache) say.
func compiledBytes(jdk testenv.JDK, pid int) (uint64, error) {
	out, err := exec.Command(filepath.Join(filepath.Dir(jdk.Java()), "jcmd"), strconv.Itoa(pid), "Compiler.codecache").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("jcmd: %v: %s", err, out)
	}
	var kb uint64
	heaps := 0
	for _, m := range regexp.MustCompile(`CodeHeap '(?:non-)?profiled nmethods': size=\d+Kb used=(\d+)Kb`).FindAllStringSubmatch(string(out), -1) {
		n, _ := strconv.ParseUint(m[1], 10, 64)
		kb += n
		heaps++
	}
	if heaps == 0 {
		return 0, fmt.Errorf("no nmethod heaps in jcmd's %q", out)
	}
	return kb << 10, nil
}

// pingPongGo hands a value back and forth between two goroutines over unbuffered channels
// for the given seconds, and prints the round trips per second: every hop a goroutine
// parking and another run.
const pingPongGo = `package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

func main() {
	secs, _ := strconv.ParseFloat(os.Args[1], 64)
	a, b := make(chan int), make(chan int)
	go func() {
		for v := range a {
			b <- v
		}
	}()
	start := time.Now()
	end := start.Add(time.Duration(secs * float64(time.Second)))
	n := 0
	for time.Now().Before(end) {
		for i := 0; i < 1000; i++ {
			a <- i
			<-b
		}
		n += 1000
	}
	fmt.Println(float64(n) / time.Since(start).Seconds())
}
`

// BenchmarkOffCPUGoroutines measures what --off-cpu-goroutines costs a Go program that
// does nothing but switch goroutines: its round trips per second alone and under sonde
// record with the probes, and the time the probes add to each round trip (two parks and
// two runs).
func BenchmarkOffCPUGoroutines(b *testing.B) {
	testenv.RequireRoot(b)
	bin := buildGoWorkload(b, "pingpong", pingPongGo)
	dir := b.TempDir()
	rate := func(args ...string) float64 {
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			b.Fatalf("%v: %v", args, err)
		}
		var v float64
		if _, err := fmt.Sscan(string(out), &v); err != nil || v <= 0 {
			b.Fatalf("%v printed %q", args, out)
		}
		return v
	}
	secs := strconv.Itoa(int(benchSpan(5*time.Second, time.Second).Seconds()))
	for range b.N {
		alone := rate(bin, secs)
		probed := rate(sonde(b), "record", "--off-cpu", "--off-cpu-goroutines", "--output", filepath.Join(dir, "p.pb.gz"), "--top", "0", "--", bin, secs)
		plain := rate(sonde(b), "record", "--off-cpu", "--output", filepath.Join(dir, "q.pb.gz"), "--top", "0", "--", bin, secs)
		b.ReportMetric(alone, "trips/s-alone")
		b.ReportMetric(plain, "trips/s-offcpu")
		b.ReportMetric(probed, "trips/s-goroutines")
		b.ReportMetric((1/probed-1/plain)*1e9, "ns-added/trip")
	}
}

// BenchmarkExecStorm runs sonde host-wide at 20 Hz while a loop starts about 120 short
// processes a second (/bin/true and sh -c, as a build, a CI runner or Kubernetes exec
// probes do), and reports its steady CPU and its peak RSS: what an exec costs an agent
// that never samples the process.
func BenchmarkExecStorm(b *testing.B) {
	testenv.RequireRoot(b)
	sonde(b)
	warmup, window := benchSpan(10*time.Second, 2*time.Second), benchSpan(30*time.Second, 3*time.Second)
	for b.Loop() {
		storm := exec.Command("sh", "-c", `while :; do /bin/true; sh -c 'exit 0'; sleep 0.016; done`)
		if err := storm.Start(); err != nil {
			b.Fatal(err)
		}
		a := startAgent(b, "--frequency", "20", "--interval", "5s")
		time.Sleep(warmup)
		before, t0 := cpuTime(b, a.cmd.Process.Pid), time.Now()
		m0 := a.metrics(b)
		time.Sleep(window)
		steady := cpuTime(b, a.cmd.Process.Pid) - before
		m1 := a.metrics(b)
		elapsed := time.Since(t0)
		peak, err := statusKiB(a.cmd.Process.Pid, "VmHWM")
		if err != nil {
			b.Fatal(err)
		}
		rss, _ := statusKiB(a.cmd.Process.Pid, "VmRSS")
		a.stop(b)
		storm.Process.Kill()
		storm.Wait()
		key := `sonde_process_reads_total{outcome="exited_in_grace"}`
		b.ReportMetric(100*steady.Seconds()/elapsed.Seconds(), "steady-cpu-%")
		b.ReportMetric(float64(rss)/1024, "rss-MiB")
		b.ReportMetric(float64(peak)/1024, "peak-rss-MiB")
		b.ReportMetric((m1[key]-m0[key])/elapsed.Seconds(), "unread-execs/s")
	}
}
