package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/trace"
)

// pyWorkload is testdata/pyworkload.py, by absolute path: stacks name it as their file.
func pyWorkload(t testing.TB) string {
	p, err := filepath.Abs("testdata/pyworkload.py")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// pythonModes are the workload's modes TestPythonStacks profiles on each interpreter.
var pythonModes = []string{"pure", "zlib", "threads", "init", "gen"}

// profilePythons runs the workload in every mode on every interpreter at once and profiles
// them with one sonde, until each process has about 500 samples: the shares asserted (0.9
// and more) are then known to within ±0.03, and the gen mode's two halves hold about 200
// each where 20 are asked for. It returns the samples of the workload in a mode on an
// interpreter.
func profilePythons(t *testing.T, pys []testenv.Python) func(t *testing.T, py int, mode string) []*trace.Sample {
	t.Helper()
	var cmds []*exec.Cmd
	for _, py := range pys {
		script := py.Script(t, pyWorkload(t))
		for _, mode := range pythonModes {
			cmds = append(cmds, py.Command(script, mode, "120"))
		}
	}
	// The workload writes "ready" once past its imports and data.
	p := startGroup(t, 0, "ready", cmds...).profile(500, "--thread-attributes", "name,id")
	return func(t *testing.T, py int, mode string) []*trace.Sample {
		t.Helper()
		samples := p.samples(py*len(pythonModes) + slices.Index(pythonModes, mode))
		if n := count(samples); n < 50 {
			t.Fatalf("%d samples of the workload", n)
		}
		return samples
	}
}

// pyFrame is a Python frame of a sample as the test reads it.
type pyFrame struct {
	name, file string
	line       int64
	index      int // in the sample's locations, leaf first
}

// pythonFrames lists a sample's CPython frames, leaf first.
func pythonFrames(s *trace.Sample) []pyFrame {
	var out []pyFrame
	for i, l := range s.Locations {
		if l.KindName() == "cpython" && len(l.Lines) > 0 {
			out = append(out, pyFrame{name: l.Lines[0].Function, file: l.Lines[0].File, line: l.Lines[0].Line, index: i})
		}
	}
	return out
}

// startsWith reports whether a sample's Python frames, leaf first, begin with want.
func startsWith(frames []pyFrame, want ...string) bool {
	if len(frames) < len(want) {
		return false
	}
	for i, w := range want {
		if frames[i].name != w {
			return false
		}
	}
	return true
}

// inSpans reports whether each frame is in file, at a line of its function's body: not
// the def line, which is also where a frame whose instruction is not known is placed.
func inSpans(frames []pyFrame, file string, spans map[string][2]int64) bool {
	for _, f := range frames {
		span, ok := spans[f.name]
		if !ok || f.file != file || f.line <= span[0] || f.line > span[1] {
			return false
		}
	}
	return true
}

// linesOf returns the line span of each function of the workload, as its source says.
func linesOf(t testing.TB, py testenv.Python, funcs ...string) map[string][2]int64 {
	t.Helper()
	script := `import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
for n in ast.walk(tree):
    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
        print(n.name, n.lineno, n.end_lineno)`
	out, err := py.Command("-c", script, py.Script(t, pyWorkload(t))).Output()
	if err != nil {
		t.Fatal(err)
	}
	spans := map[string][2]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var name string
		var a, b int64
		if _, err := fmt.Sscan(line, &name, &a, &b); err == nil {
			spans[name] = [2]int64{a, b}
		}
	}
	for _, f := range funcs {
		if _, ok := spans[f]; !ok {
			t.Fatalf("no function %s in the workload", f)
		}
	}
	return spans
}

// TestPythonStacks profiles every CPython 3.9-3.15 of the machine, Debian's own 3.13,
// 3.14 and 3.15 and Ubuntu's 3.13 and 3.14 in a container, and a free-threaded 3.14, on
// the workloads and checks their stacks read as the program calls: Python frames by
// name, file and line, interleaved with native code, per thread (each on its own copy of
// the bytecode in the free-threaded build), through generators and coroutines.
func TestPythonStacks(t *testing.T) {
	testenv.RequireRoot(t)
	pys := testenv.EveryPython(t)
	profiled := profilePythons(t, pys)
	for i, py := range pys {
		t.Run(py.Name, func(t *testing.T) {
			file := py.Script(t, pyWorkload(t))
			spans := linesOf(t, py, "main", "outer", "middle", "inner", "a_inner", "a_outer", "b_inner", "b_outer")
			t.Run("pure", func(t *testing.T) {
				var n, good int64
				for _, s := range profiled(t, i, "pure") {
					n += s.Count
					fs := pythonFrames(s)
					if !startsWith(fs, "inner", "middle", "outer", "main") {
						continue
					}
					if inSpans(fs[:4], file, spans) {
						good += s.Count
					}
				}
				share := float64(good) / float64(n)
				t.Logf("%.3f of %d samples show inner <- middle <- outer <- main with file and line", share, n)
				if share < 0.95 {
					t.Errorf("%.3f of %d samples show inner <- middle <- outer <- main with file and line, want 0.95", share, n)
				}
			})
			t.Run("zlib", func(t *testing.T) {
				// The compression runs in libz's deflate, called from zlib.compress, called
				// from compress_it: the native frames come first, leaf first, then the
				// Python frame that made the call.
				var native, ordered int64
				for _, s := range profiled(t, i, "zlib") {
					deflate := slices.IndexFunc(s.Locations, func(l *trace.Location) bool {
						return l.Kind == trace.FrameNative && len(l.Lines) > 0 && strings.HasPrefix(l.Lines[0].Function, "deflate")
					})
					if deflate < 0 {
						continue
					}
					native += s.Count
					fs := pythonFrames(s)
					if startsWith(fs, "compress_it", "outer_zlib", "main") && fs[0].index > deflate {
						ordered += s.Count
					}
				}
				if native < 20 {
					t.Fatalf("%d samples in deflate", native)
				}
				share := float64(ordered) / float64(native)
				t.Logf("%.3f of %d samples in deflate show compress_it <- outer_zlib <- main above it", share, native)
				if share < 0.9 {
					t.Errorf("%.3f of %d samples in deflate show compress_it <- outer_zlib <- main above it, want 0.9", share, native)
				}
			})
			t.Run("threads", func(t *testing.T) {
				byThread := map[uint32]map[string]int64{}
				var chains, placed int64
				for _, s := range profiled(t, i, "threads") {
					fs := pythonFrames(s)
					key := "other"
					switch {
					case startsWith(fs, "a_inner", "a_outer"):
						key = "a"
					case startsWith(fs, "b_inner", "b_outer"):
						key = "b"
					}
					if key != "other" {
						chains += s.Count
						if inSpans(fs[:2], file, spans) {
							placed += s.Count
						}
					}
					for _, f := range fs {
						if key == "a" && strings.HasPrefix(f.name, "b_") || key == "b" && strings.HasPrefix(f.name, "a_") {
							t.Errorf("thread %d: a stack mixing the threads' chains: %v", s.TID, fs)
						}
					}
					if byThread[s.TID] == nil {
						byThread[s.TID] = map[string]int64{}
					}
					byThread[s.TID][key] += s.Count
				}
				// Each worker thread shows its own chain, and nothing of the other's.
				var a, b int
				for tid, keys := range byThread {
					total := keys["a"] + keys["b"] + keys["other"]
					switch {
					case keys["a"] > 0 && keys["b"] > 0:
						t.Errorf("thread %d shows both chains: %v", tid, keys)
					case keys["a"] >= total*9/10 && total >= 20:
						a++
					case keys["b"] >= total*9/10 && total >= 20:
						b++
					}
				}
				t.Logf("samples per thread and chain: %v", byThread)
				if a != 1 || b != 1 {
					t.Errorf("want one thread with a_inner <- a_outer and one with b_inner <- b_outer: %v", byThread)
				}
				// The lines: a thread other than the first may run its own copy of the
				// bytecode (free-threaded builds), where an offset from the code object's
				// would land anywhere.
				share := float64(placed) / float64(max(chains, 1))
				t.Logf("%.3f of %d samples of the threads' chains have file and lines in their functions", share, chains)
				if share < 0.95 {
					t.Errorf("%.3f of %d samples of the threads' chains have file and lines in their functions, want 0.95", share, chains)
				}
			})
			t.Run("init", func(t *testing.T) {
				// 3.13 runs a shim between the instantiation and __init__: left out. Code
				// objects have qualified names since 3.11 only.
				init := "K.__init__"
				if strings.HasPrefix(py.Version, "3.9.") || strings.HasPrefix(py.Version, "3.10.") {
					init = "__init__"
				}
				var n, direct int64
				for _, s := range profiled(t, i, "init") {
					n += s.Count
					if startsWith(pythonFrames(s), init, "make", "main") {
						direct += s.Count
					}
				}
				share := float64(direct) / float64(n)
				t.Logf("%.3f of %d samples show %s <- make <- main", share, n, init)
				if share < 0.9 {
					t.Errorf("%.3f of %d samples show %s <- make <- main, want 0.9", share, n, init)
				}
			})
			t.Run("gen", func(t *testing.T) {
				var gen, coro int64
				samples := profiled(t, i, "gen")
				for _, s := range samples {
					fs := pythonFrames(s)
					switch {
					case startsWith(fs, "gen_inner", "gen_outer", "consume_until", "main"):
						gen += s.Count
					case startsWith(fs, "coro_inner", "coro_outer", "coro_main") && fs[len(fs)-1].name == "<module>":
						coro += s.Count
					}
				}
				t.Logf("%d samples in the generator, %d in the coroutine", gen, coro)
				if gen < 20 || coro < 20 {
					logTopStacks(t, samples, 6)
					t.Errorf("%d samples show gen_inner <- gen_outer <- consume_until <- main, %d coro_inner <- coro_outer <- coro_main; want 20 each", gen, coro)
				}
			})
		})
	}
}

// BenchmarkPythonSample measures the kernel's cost per sample (bpf_stats) of a Python
// process in its eval loop, Python frames walked, against a native process of about the
// same native depth, whose only Python cost is a map lookup.
func BenchmarkPythonSample(b *testing.B) {
	testenv.RequireRoot(b)
	measure := func(b *testing.B, args ...string) {
		w := exec.Command(args[0], args[1:]...)
		if err := w.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { w.Process.Kill(); w.Wait() }()
		time.Sleep(300 * time.Millisecond)
		for b.Loop() {
			ns, _ := bpfStats(b, w.Process.Pid)
			b.ReportMetric(ns, "bpf-ns/sample")
		}
	}
	b.Run("native", func(b *testing.B) {
		measure(b, buildWorkload(b, "depth", depthC, "-O2", "-fomit-frame-pointer"), "60", "20")
	})
	for _, py := range testenv.Pythons(b) {
		b.Run("python-"+py.Version, func(b *testing.B) {
			measure(b, py.Path, filepath.Join("testdata", "pyworkload.py"), "pure", "60")
		})
	}
}
