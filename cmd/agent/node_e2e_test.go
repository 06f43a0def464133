package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/trace"
)

// nodeWorkload is testdata/nodeworkload.js, by absolute path: stacks name it as their file.
func nodeWorkload(t testing.TB) string {
	p, err := filepath.Abs("testdata/nodeworkload.js")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// jsSpans returns the line span of each function of the workload: from its "function
// NAME(" line to the next "}" at column 0.
func jsSpans(t testing.TB) map[string][2]int64 {
	return sourceSpans(t, nodeWorkload(t), regexp.MustCompile(`^()(?:async )?function (\w+)\(`))
}

// sourceSpans returns the line span of each function of a source file: from a line start
// matches (its first group the line's indent, its second the function's name) to the next
// line holding only that indent and "}".
func sourceSpans(t testing.TB, path string, start *regexp.Regexp) map[string][2]int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	spans := map[string][2]int64{}
	var cur, indent string
	var line int64
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line++
		if m := start.FindStringSubmatch(sc.Text()); m != nil && cur == "" {
			cur, indent = m[2], m[1]
			spans[cur] = [2]int64{line, line}
		} else if cur != "" && sc.Text() == indent+"}" {
			spans[cur] = [2]int64{spans[cur][0], line}
			cur = ""
		}
	}
	return spans
}

// srcFrame is a runtime's frame of a sample: inlined functions are frames of their own.
type srcFrame struct {
	name, file string
	line       int64
}

// framesOfKind lists a sample's frames of one runtime's kind (the OTLP frame type), leaf
// first, each location's inlined functions first.
func framesOfKind(s *trace.Sample, kind string) []srcFrame {
	var out []srcFrame
	for _, l := range s.Locations {
		if l.KindName() != kind {
			continue
		}
		for _, ln := range l.Lines {
			out = append(out, srcFrame{name: ln.Function, file: ln.File, line: ln.Line})
		}
	}
	return out
}

// jsFrames lists a sample's V8 frames.
func jsFrames(s *trace.Sample) []srcFrame { return framesOfKind(s, "v8js") }

// nodeCommand runs the workload in one mode on one node with flags, for two minutes.
func nodeCommand(t testing.TB, node testenv.Node, mode string, flags ...string) *exec.Cmd {
	return exec.Command(node.Path, append(append([]string{}, flags...), nodeWorkload(t), mode, "120")...)
}

// profileNode runs the workload in one mode on one node with flags, and profiles it with
// sonde into OTLP until it has 500 samples.
func profileNode(t *testing.T, node testenv.Node, mode string, flags ...string) []*trace.Sample {
	t.Helper()
	return atLeast50(t, profileRuntime(t, nodeCommand(t, node, mode, flags...)))
}

// atLeast50 returns a workload's samples, failing the test when they are fewer than 50,
// too few for the shares the tests assert.
func atLeast50(t *testing.T, samples []*trace.Sample) []*trace.Sample {
	t.Helper()
	if n := count(samples); n < 50 {
		t.Fatalf("%d samples of the workload", n)
	}
	return samples
}

// runtimeWarm is the CPU a runtime's workload uses before it is profiled: past start-up,
// its hot code compiled where the runtime compiles.
const runtimeWarm = 1500 * time.Millisecond

// profileRuntime starts a runtime's workload and, once it has used 1.5 s of CPU (past
// start-up, its hot code compiled where the runtime compiles), profiles it with sonde
// into OTLP until sonde has 500 samples; it returns the samples of the workload's process.
func profileRuntime(t *testing.T, cmd *exec.Cmd, sondeArgs ...string) []*trace.Sample {
	t.Helper()
	sonde(t) // built before the workload starts, whose seconds must not run out meanwhile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	testenv.WaitCPU(t, cmd.Process.Pid, runtimeWarm)
	out := filepath.Join(t.TempDir(), "p.otlp.pb")
	args := append([]string{"--pid", strconv.Itoa(cmd.Process.Pid), "--output", out, "--top", "0"}, sondeArgs...)
	if r := runSondeUntil(t, 500, args...); r.Err != nil {
		t.Fatalf("sonde: %v\n%s", r.Err, r.Stderr)
	}
	profiles, err := otlp.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var samples []*trace.Sample
	for _, p := range profiles {
		for _, s := range p.Samples {
			if s.Process != nil && s.Process.PID == uint32(cmd.Process.Pid) {
				samples = append(samples, s)
			}
		}
	}
	return samples
}

// checkChain checks that at least 95 % of the samples show want (leaf first) as their
// innermost JavaScript frames, each with the workload's file and a line within its
// function, and that no frame is named after the decoy, which is not running. With
// callersOwn, a sample may show only the outer part of want, down to its last function:
// the time a caller spends in code of its own (the gc mode's new Function compiles in
// okapiMiddle; Date.now and the write barriers V8 gives okapiMain's own position).
func checkChain(t *testing.T, samples []*trace.Sample, callersOwn bool, want ...string) {
	t.Helper()
	file, spans := nodeWorkload(t), jsSpans(t)
	var n, good int64
	var bad [][]srcFrame
	for _, s := range samples {
		n += s.Count
		fs := jsFrames(s)
		// V8's builtins called as functions (Math.imul in code that does not inline it)
		// are frames of their own, without a script.
		for len(fs) > 0 && fs[0].file == "" {
			fs = fs[1:]
		}
		for _, f := range fs {
			if strings.HasPrefix(f.name, "decoy") {
				t.Errorf("a frame named after %s, which does not run: %v", f.name, fs)
			}
		}
		match := func(want []string) bool {
			if len(fs) < len(want) {
				return false
			}
			for i, w := range want {
				span, f := spans[w], fs[i]
				if f.name != w || f.file != file || f.line < span[0] || f.line > span[1] {
					return false
				}
			}
			return true
		}
		ok := match(want)
		for k := 1; callersOwn && !ok && k < len(want); k++ {
			ok = match(want[k:])
		}
		if !ok && len(bad) < 5 {
			bad = append(bad, fs)
		}
		if ok {
			good += s.Count
		}
	}
	share := float64(good) / float64(n)
	t.Logf("%.3f of %d samples show %s with file and line", share, n, strings.Join(want, " <- "))
	if share < 0.95 {
		t.Errorf("%.3f of %d samples show %s with file and line, want 0.95; some samples' frames: %v", share, n, strings.Join(want, " <- "), bad)
	}
}

// TestNodeStacks profiles Node.js programs (Node 20, and the LTS lines 22 and 24) and
// checks their JavaScript frames by name, file and line: optimized (with inlining),
// interpreted only, async, and while the collector moves objects and code is compiled
// continuously. Names that occur nowhere
// else tell a misnamed frame.
func TestNodeStacks(t *testing.T) {
	testenv.RequireRoot(t)
	type run struct {
		mode  string
		flags []string
	}
	runs := map[string]run{
		"optimized":   {"chain", nil},
		"interpreted": {"chain", []string{"--no-opt", "--no-maglev", "--no-sparkplug"}},
		"baseline":    {"chain", []string{"--no-opt", "--no-maglev", "--always-sparkplug"}},
		"async":       {"async", nil},
		"gc":          {"gc", nil},
	}
	nodes := testenv.Nodes(t)
	var cmds []*exec.Cmd
	index := map[string]int{}
	for _, node := range nodes {
		for name, r := range runs {
			index[node.Name+"/"+name] = len(cmds)
			cmds = append(cmds, nodeCommand(t, node, r.mode, r.flags...))
		}
	}
	// Ten more runs of Node 22's optimized chain: a read that failed once used to leave a
	// run's names wrong to its end (2 runs in 9), so one flaky name is a failure here.
	node22 := testenv.NPMNode(t, 22)
	const repeats = 10
	first := len(cmds)
	for range repeats {
		cmds = append(cmds, nodeCommand(t, node22, "chain"))
	}
	p := startGroup(t, runtimeWarm, "", cmds...).profile(500)
	t.Run("ten runs of "+node22.Name, func(t *testing.T) {
		for i := range repeats {
			checkChain(t, atLeast50(t, p.samples(first+i)), false, "quokkaLeaf", "quokkaMiddle", "quokkaOuter", "quokkaMain")
		}
	})
	for _, node := range nodes {
		t.Run(node.Name, func(t *testing.T) {
			profiled := func(t *testing.T, name string) []*trace.Sample {
				t.Helper()
				return atLeast50(t, p.samples(index[node.Name+"/"+name]))
			}
			t.Run("optimized", func(t *testing.T) {
				checkChain(t, profiled(t, "optimized"), false, "quokkaLeaf", "quokkaMiddle", "quokkaOuter", "quokkaMain")
			})
			t.Run("interpreted", func(t *testing.T) {
				checkChain(t, profiled(t, "interpreted"), false, "quokkaLeaf", "quokkaMiddle", "quokkaOuter", "quokkaMain")
			})
			t.Run("baseline", func(t *testing.T) {
				// Sparkplug's code only: frames named by their function, at its first line.
				checkChain(t, profiled(t, "baseline"), false, "quokkaLeaf", "quokkaMiddle", "quokkaOuter", "quokkaMain")
			})
			t.Run("async", func(t *testing.T) {
				// After its first await, an async function runs from the microtask queue:
				// its awaiting callers are not on the stack, V8's own frames are.
				checkChain(t, profiled(t, "async"), false, "tapirLeaf")
			})
			t.Run("gc", func(t *testing.T) {
				checkChain(t, profiled(t, "gc"), true, "okapiLeaf", "okapiMiddle", "okapiMain")
			})
		})
	}
}

// TestNodeUnnamed profiles a Node whose V8 metadata lacks what sonde names functions
// with (Node 22's, a field's symbol renamed): its JavaScript frames are walked and named
// [v8], never guessed, and the native frames below them stay, down to node::Start.
func TestNodeUnnamed(t *testing.T) {
	testenv.RequireRoot(t)
	node := testenv.NodeWithoutNaming(t)
	var n, good int64
	for _, s := range profileNode(t, node, "chain") {
		n += s.Count
		fs := jsFrames(s)
		named := false
		for _, f := range fs {
			if f.name != "[v8]" && !strings.HasPrefix(f.name, "Builtins_") {
				t.Errorf("a frame of an unnamed V8 named %q", f.name)
			}
			named = named || f.name == "[v8]"
		}
		root := false
		for _, l := range s.Locations {
			root = root || len(l.Lines) > 0 && strings.HasPrefix(l.Lines[0].Function, "node::Start")
		}
		if named && root {
			good += s.Count
		}
	}
	share := float64(good) / float64(n)
	t.Logf("%s: %.3f of %d samples show [v8] frames above node::Start", node.Name, share, n)
	if share < 0.95 {
		t.Errorf("%s: %.3f of %d samples show [v8] frames above node::Start, want 0.95", node.Name, share, n)
	}
}

// TestNodeRecord: sonde record -- node app.js profiles the program from its first
// instruction to its exit, and its flame graph reads as a JavaScript profile: the chain by
// name, file and line in most samples (the rest are node's start-up), in the OTLP file and
// in the flame graph page.
func TestNodeRecord(t *testing.T) {
	testenv.RequireRoot(t)
	file, spans := nodeWorkload(t), jsSpans(t)
	want := []string{"quokkaLeaf", "quokkaMiddle", "quokkaOuter", "quokkaMain"}
	for _, node := range testenv.Nodes(t) {
		t.Run(node.Name, func(t *testing.T) {
			dir := t.TempDir()
			out, page := filepath.Join(dir, "r.otlp.pb"), filepath.Join(dir, "r.html")
			cmd := exec.Command(sonde(t), "record", "--output", out, "--output", page, "--top", "0", "--", node.Path, file, "chain", "5")
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("sonde record: %v\n%s", err, b)
			}
			profiles, err := otlp.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var n, good int64
			for _, p := range profiles {
				for _, s := range p.Samples {
					n += s.Count
					fs := jsFrames(s)
					for len(fs) > 0 && fs[0].file == "" {
						fs = fs[1:]
					}
					ok := len(fs) >= len(want)
					for i := 0; ok && i < len(want); i++ {
						span := spans[want[i]]
						ok = fs[i].name == want[i] && fs[i].file == file && fs[i].line >= span[0] && fs[i].line <= span[1]
					}
					if ok {
						good += s.Count
					}
				}
			}
			share := float64(good) / float64(max(n, 1))
			t.Logf("%s: %.3f of %d samples show %s with file and line", node.Name, share, n, strings.Join(want, " <- "))
			if share < 0.75 {
				t.Errorf("%.3f of %d samples show the chain, want 0.75", share, n)
			}
			html, err := os.ReadFile(page)
			if err != nil {
				t.Fatal(err)
			}
			for _, fn := range want {
				if !strings.Contains(string(html), fn) {
					t.Errorf("the flame graph page does not name %s", fn)
				}
			}
		})
	}
}

// BenchmarkNodeSample measures the kernel's cost per sample (bpf_stats) of a Node.js
// program in optimized JavaScript, V8's frames walked, against a native program of about
// the same native depth. The goal: within 1.5 times the native cost.
func BenchmarkNodeSample(b *testing.B) {
	testenv.RequireRoot(b)
	ws := []sampleWorkload{{"native", []string{buildWorkload(b, "depth", depthC, "-O2", "-fomit-frame-pointer"), "60", "20"}}}
	for _, node := range testenv.Nodes(b) {
		ws = append(ws, sampleWorkload{"node-" + node.Version, []string{node.Path, nodeWorkload(b), "chain", "60"}})
	}
	compareBPFPerSample(b, ws)
}

// sampleWorkload is a program whose kernel cost per sample a benchmark measures.
type sampleWorkload struct {
	name string
	argv []string
}

// compareBPFPerSample measures the kernel's cost per sample (bpf_stats) of each workload,
// each alone as sonde profiles it at 99 Hz, the workloads in turn in every round
// (-benchtime Nx: N rounds). It reports each one's median and, for the others, their
// median over the first one's. The goals are about that ratio; runs taken in turn share
// the host's slower and faster minutes, where one workload's runs after another's
// measured the host's drift as much as the walkers (single runs on this kind of machine
// spread by half).
func compareBPFPerSample(b *testing.B, ws []sampleWorkload) {
	runs := make([][]float64, len(ws))
	for b.Loop() {
		for i, w := range ws {
			runs[i] = append(runs[i], bpfPerSample(b, w.argv...))
		}
	}
	base := median(runs[0])
	for i, w := range ws {
		m := median(runs[i])
		b.ReportMetric(m, w.name+"-bpf-ns/sample")
		if i > 0 {
			b.ReportMetric(m/base, w.name+"/"+ws[0].name)
		}
		b.Logf("%s: %.0f ns per sample, median of %v", w.name, m, runs[i])
	}
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// bpfPerSample starts a workload, profiles it for 4 s at 99 Hz once it is past its
// start-up, stops it, and returns the kernel's cost per sample of it (bpf_stats).
func bpfPerSample(b *testing.B, args ...string) float64 {
	w := exec.Command(args[0], args[1:]...)
	if err := w.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { w.Process.Kill(); w.Wait() }()
	testenv.WaitCPU(b, w.Process.Pid, time.Second) // optimized by then
	ns, _ := bpfStats(b, w.Process.Pid, "--frequency", "99")
	return ns
}

// compileChurnJS compiles a new function with source of its own, runs it a while and drops
// it, for the given seconds: V8's code space and sonde's names of it churn all along.
const compileChurnJS = `let n = 0, sink = 0;
const end = Date.now() + Number(process.argv[2]) * 1000;
while (Date.now() < end) {
  const f = new Function('a', 'let s = a; for (let i = 0; i < 20000; i++) s = (s * 31 + i + ' + (n++) + ') | 0; return s;');
  sink += f(n);
}
console.log(n, sink);
`

// BenchmarkNodeCompileChurn profiles a Node.js program that compiles new functions
// continuously, at 99 Hz with every frame named, for two minutes (ten with SONDE_SOAK=1,
// four seconds with -short), and reports sonde's RSS and live Go heap (its floor over a few
// intervals) at one minute (a fifth with -short), halfway and at the end: what the
// functions' names cost must stop growing once the caches that hold them are full.
func BenchmarkNodeCompileChurn(b *testing.B) {
	testenv.RequireRoot(b)
	run, first := benchSpan(2*time.Minute, 4*time.Second), benchSpan(time.Minute, time.Second)
	if os.Getenv("SONDE_SOAK") != "" {
		run = 10 * time.Minute
	}
	for _, node := range testenv.Nodes(b) {
		b.Run("node-"+node.Version, func(b *testing.B) {
			script := filepath.Join(b.TempDir(), "churn.js")
			if err := os.WriteFile(script, []byte(compileChurnJS), 0o644); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				cmd := exec.Command(node.Path, script, strconv.Itoa(int(run.Seconds())+60))
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
				a := startAgent(b, "--pid", strconv.Itoa(cmd.Process.Pid), "--frequency", "99", "--interval", "10s")
				reading := func() (rss float64, heap float64) {
					kib, err := statusKiB(a.cmd.Process.Pid, "VmRSS")
					if err != nil {
						b.Fatal(err)
					}
					return float64(kib) / 1024, a.floorHeap(b, a.metrics(b)["go_gc_heap_live_bytes"]) / (1 << 20)
				}
				time.Sleep(first)
				rss1, heap1 := reading()
				time.Sleep(run/2 - first)
				rssHalf, heapHalf := reading()
				time.Sleep(run / 2)
				rssEnd, heapEnd := reading()
				a.stop(b)
				b.ReportMetric(rss1, "rss-1min-MiB")
				b.ReportMetric(rssHalf, "rss-half-MiB")
				b.ReportMetric(rssEnd, "rss-end-MiB")
				b.ReportMetric(heap1, "live-heap-1min-MiB")
				b.ReportMetric(heapHalf, "live-heap-half-MiB")
				b.ReportMetric(heapEnd, "live-heap-end-MiB")
			}
		})
	}
}
