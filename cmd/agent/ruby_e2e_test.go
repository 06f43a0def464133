package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sonde-profiler/sonde/internal/procfs"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/trace"
)

// rbWorkload is testdata/rbworkload.rb, by absolute path: stacks name it as their file.
func rbWorkload(t testing.TB) string {
	p, err := filepath.Abs("testdata/rbworkload.rb")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var rubyModes = []string{"pure", "block", "times", "threads"}

// rubyRootChains are the modes whose chain is checked from the root, as the Ruby frames
// nearest the process's start, whatever is above them.
var rubyRootChains = map[string]bool{"times": true}

// rubyChains are the modes' Ruby frames, leaf first, named as Ruby 3.4's backtraces name
// them (a method with its class or module, "." for a singleton method), but for the
// script's top-level methods (Object's), which keep their bare names; each held while the
// mode runs its hot method; threads has one per thread.
var rubyChains = map[string][]string{
	"pure": {"Farm::Orchard#weigh", "Farm::Orchard#sort_fruit", "Farm::Orchard#pluck", "Farm::Orchard.pick", "orchard", "<main>"},
	// Array#each is a C method: named by its method entry, under the native frames that
	// run it and yield to the block.
	"block": {"weigh_basket", "block in harvest", "Array#each", "harvest", "<main>"},
	// Root side only (rubyRootChains): a sample in Integer#times's C code (3.1; Ruby code
	// in 3.3), or in the VM entering the tiny block from it, holds the rest as well. Most
	// samples have Integer#times above tally (rubyTimes).
	"times": {"tally", "count", "<main>"},
}

// rbMethod is the name a chain's frame has in the file: its method's, without the class.
func rbMethod(frame string) string {
	frame = strings.TrimPrefix(frame, "block in ")
	if i := strings.LastIndexAny(frame, "#."); i >= 0 {
		return frame[i+1:]
	}
	return frame
}

// rbFrames lists a sample's Ruby frames, leaf first.
func rbFrames(s *trace.Sample) []runtimeFrame { return runtimeFrames(s, "ruby") }

// rbSpans returns the lines of each method of a Ruby file written as the workload is: "def
// name" opens one, an "end" at its indentation closes it; "<main>" is the file.
func rbSpans(t testing.TB, file string) map[string][2]int64 {
	return blockSpans(t, file, "<main>", regexp.MustCompile(`^(\s*)def (?:self\.)?(\w+)`), "", "end")
}

// TestRubyStacks profiles Debian 12's Ruby 3.1 on the host, Debian's Ruby 3.3 (sid) and
// 3.4 (experimental) in a container, and Ruby 3.3 built with YJIT and run with --yjit, on workloads whose hot
// method is called from Ruby, from a block a C method (Array#each) yields to, and from two
// threads at once, and checks their stacks read as the program calls: Ruby frames by
// class, method, file and line, the C method's native frames between the block and it,
// each thread its own chain, complete to the native root (through YJIT's code).
func TestRubyStacks(t *testing.T) {
	testenv.RequireRoot(t)
	rubies := []testenv.Ruby{testenv.HostRuby(t), testenv.DebianRuby(t), testenv.DebianRuby34(t), testenv.YJITRuby(t)}
	var cmds []*exec.Cmd
	for _, r := range rubies {
		for _, m := range rubyModes {
			cmds = append(cmds, r.Command(r.Script(t, rbWorkload(t)), m, "120"))
		}
	}
	p := startGroup(t, 0, "ready", cmds...).profile(300, "--thread-attributes", "name,id")
	spans := rbSpans(t, rbWorkload(t))
	for i, r := range rubies {
		file := r.Script(t, rbWorkload(t))
		for j, mode := range rubyModes {
			t.Run(r.Name+"/"+mode, func(t *testing.T) {
				samples := p.samples(i*len(rubyModes) + j)
				if mode == "threads" {
					checkRubyThreads(t, samples)
					return
				}
				chain := rubyChains[mode]
				var n, good, between, complete, times int64
				var other []*trace.Sample // without the chain, to show a failure
				for _, s := range samples {
					n += s.Count
					fs := rbFrames(s)
					// C methods the hot method calls (YJIT's Integer#*, which the
					// interpreter runs inline) may come first.
					for len(fs) > 0 && fs[0].file == "" && !rubyRootChains[mode] {
						fs = fs[1:]
					}
					if len(fs) < len(chain) {
						other = append(other, s)
						continue
					}
					all := fs
					if rubyRootChains[mode] {
						fs = fs[len(fs)-len(chain):]
					}
					ok := true
					for k, want := range chain {
						f := fs[k]
						if f.name != want {
							ok = false
							break
						}
						if want == "<main>" || want == "Array#each" || want == "Integer#times" {
							continue
						}
						span := spans[rbMethod(want)]
						if f.file != file || f.line < span[0] || f.line > span[1] {
							ok = false
						}
					}
					if !ok {
						other = append(other, s)
						continue
					}
					good += s.Count
					if mode == "times" && len(all) > len(chain) && all[len(all)-len(chain)-1].name == "Integer#times" {
						times += s.Count
					}
					if mode == "block" && fs[2].index-fs[1].index > 1 && fs[3].index-fs[2].index == 1 {
						between += s.Count // Array#each's native frames yield to the block
					}
					if s.Locations[len(s.Locations)-1].KindName() == "native" {
						complete += s.Count
					}
				}
				if n < 50 {
					t.Fatalf("%d samples of the workload", n)
				}
				share := float64(good) / float64(n)
				t.Logf("%.3f of %d samples show %s with file and line; %d complete to the native root", share, n, strings.Join(chain, " <- "), complete)
				// The times mode enters a tiny block from C millions of times a second: a
				// sample between the block's frame being pushed and the VM's entry for it
				// (or after its exit, before the pop) reads the chain at the wrong
				// activation, 3-5 % of them on 3.1. The other modes hold the 0.95.
				want := 0.95
				if mode == "times" {
					want = 0.9
				}
				if share < want {
					logTopStacks(t, other, 6)
					t.Errorf("%.3f of %d samples show %s with file and line, want %.2f", share, n, strings.Join(chain, " <- "), want)
				}
				if float64(complete) < 0.9*float64(good) {
					t.Errorf("%d of %d samples reach the native root below <main>, want 0.9", complete, good)
				}
				if mode == "times" && float64(times) < 0.9*float64(good) {
					t.Errorf("%d of %d samples show Integer#times above tally, want 0.9", times, good)
				}
				if mode == "block" && float64(between) < 0.9*float64(good) {
					t.Errorf("%d of %d samples have native frames between the block and Array#each, and none between it and harvest, want 0.9", between, good)
				}
			})
		}
	}
}

// checkRubyThreads: each of the two threads shows its own chain, never the other's.
func checkRubyThreads(t *testing.T, samples []*trace.Sample) {
	t.Helper()
	byThread := map[uint32]map[string]int64{}
	for _, s := range samples {
		fs := rbFrames(s)
		// The loop's Process.clock_gettime, a C method, may be the leaf.
		for len(fs) > 0 && fs[0].file == "" {
			fs = fs[1:]
		}
		key := "other"
		switch {
		case len(fs) >= 2 && fs[0].name == "a_inner" && fs[1].name == "a_outer":
			key = "a"
		case len(fs) >= 2 && fs[0].name == "b_inner" && fs[1].name == "b_outer":
			key = "b"
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
	var a, b int
	for tid, keys := range byThread {
		total := keys["a"] + keys["b"] + keys["other"]
		t.Logf("thread %d: %v", tid, keys)
		switch {
		case keys["a"] > 0 && keys["b"] > 0:
			t.Errorf("thread %d shows both chains: %v", tid, keys)
		case keys["a"] >= total*9/10 && total >= 20:
			a++
		case keys["b"] >= total*9/10 && total >= 20:
			b++
		}
	}
	if a != 1 || b != 1 {
		t.Errorf("%d threads mostly in a_inner <- a_outer and %d in b_inner <- b_outer, want one each", a, b)
	}
}

// TestRubyForkedWorkers attaches to a Ruby process that forks its workers after boot, as a
// preforking server (Unicorn, Puma's cluster mode) does, with --children: each worker is
// profiled in its own right, its frames named from its own copy of the VM.
func TestRubyForkedWorkers(t *testing.T) {
	testenv.RequireRoot(t)
	r := testenv.HostRuby(t)
	g := startGroup(t, 0, "ready", r.Command(rbWorkload(t), "fork", "120"))
	master := g.pids[0]
	var workers []uint32
	testenv.WaitFor(t, "two workers forked", testenv.StartTimeout, func() (bool, string) {
		workers = procfs.Descendants("/proc", []uint32{uint32(master)}, 10)[1:]
		return len(workers) >= 2, fmt.Sprint(workers)
	})
	t.Cleanup(func() { // the group ends the master; its workers would run on
		for _, pid := range workers {
			syscall.Kill(int(pid), syscall.SIGKILL)
		}
	})
	out := filepath.Join(t.TempDir(), "p.otlp.pb")
	s := testenv.StartSonde(t, sonde(t), "--pid", strconv.Itoa(master), "--children", "--output", out, "--top", "0")
	ok := s.WaitReady() && s.WaitSamples(600)
	res := s.Stop()
	if !ok || res.Err != nil {
		t.Fatalf("sonde: %v\n%s", res.Err, res.Stderr)
	}
	profiles, err := otlp.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	// The worker runs the block fork was given, in the block Array.new was: orchard is
	// called from it.
	chain := []string{"Farm::Orchard#weigh", "Farm::Orchard#sort_fruit", "Farm::Orchard#pluck", "Farm::Orchard.pick", "orchard", "block (2 levels) in <main>"}
	perWorker := map[uint32][2]int64{}
	for _, pr := range profiles {
		for _, smp := range pr.Samples {
			if smp.Process == nil || smp.Process.PID == uint32(master) {
				continue
			}
			c := perWorker[smp.Process.PID]
			c[0] += smp.Count
			fs := rbFrames(smp)
			named := len(fs) >= len(chain)
			for k := 0; named && k < len(chain); k++ {
				named = fs[k].name == chain[k]
			}
			if named {
				c[1] += smp.Count
			}
			perWorker[smp.Process.PID] = c
		}
	}
	if len(perWorker) != 2 {
		t.Fatalf("samples of %d workers, want the 2 forked: %v", len(perWorker), perWorker)
	}
	for pid, c := range perWorker {
		share := float64(c[1]) / float64(c[0])
		t.Logf("worker %d: %.3f of %d samples show %s", pid, share, c[0], strings.Join(chain, " <- "))
		if c[0] < 50 || share < 0.95 {
			t.Errorf("worker %d: %.3f of %d samples show the chain, want 0.95 of at least 50", pid, share, c[0])
		}
	}
}

// BenchmarkRubySample measures the kernel's cost per sample of Debian 12's Ruby 3.1, and
// of Ruby 3.3 with YJIT, running the pure workload (six Ruby frames over eight native
// ones) against the native C workload's, as BenchmarkNodeSample does for V8.
func BenchmarkRubySample(b *testing.B) {
	testenv.RequireRoot(b)
	r, yjit := testenv.HostRuby(b), testenv.YJITRuby(b)
	compareBPFPerSample(b, []sampleWorkload{
		{"native", []string{buildWorkload(b, "depth", depthC, "-O2", "-fomit-frame-pointer"), "60", "20"}},
		{"ruby-" + r.Version, []string{r.Path, rbWorkload(b), "pure", "60"}},
		{"ruby-" + yjit.Version + "-yjit", append(append([]string{yjit.Path}, yjit.Flags...), rbWorkload(b), "pure", "60")},
	})
}

// spinnerC is a C extension: Spinner.grind(rounds) spins in C, yielding to its block
// after each round.
const spinnerC = `#include <ruby.h>

static VALUE grind(VALUE self, VALUE rounds) {
	unsigned long x = 1;
	long n = NUM2LONG(rounds);
	for (long r = 0; r < n; r++) {
		for (int i = 0; i < 200000; i++)
			x = x * 6364136223846793005UL + 1442695040888963407UL;
		rb_yield(ULONG2NUM(x >> 56));
	}
	return ULONG2NUM(x);
}

void Init_spinner(void) {
	VALUE m = rb_define_module("Spinner");
	rb_define_module_function(m, "grind", grind, 1);
}
`

// TestRubyCExtension profiles Debian 12's Ruby 3.1 calling a C extension's method, built
// here against ruby3.1-dev, that spins in C and yields to a Ruby block: the extension's
// method is named as Ruby names it (Spinner.grind), its native code (grind, from the
// extension's own symbols) above it, and the block's Ruby frames above that.
func TestRubyCExtension(t *testing.T) {
	testenv.RequireRoot(t)
	r := testenv.HostRuby(t)
	ext := filepath.Join(t.TempDir(), "spinner.so")
	gcc := testenv.RequireTool(t, "gcc")
	src := filepath.Join(t.TempDir(), "spinner.c")
	if err := os.WriteFile(src, []byte(spinnerC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-O2", "-g", "-I/usr/include/ruby-3.1.0",
		"-I/usr/include/x86_64-linux-gnu/ruby-3.1.0", "-o", ext, src, "-lruby-3.1").CombinedOutput(); err != nil {
		testenv.Unavailable(t, "build a C extension (apt-get install ruby3.1-dev): %v\n%s", err, out)
	}
	p := startGroup(t, 0, "ready", r.Command(rbWorkload(t), "ext", "120", ext)).profile(400)
	root := []string{"Spinner.grind", "mill", "<main>"}
	var n, rooted, inC, inBlock int64
	var other []*trace.Sample
	for _, s := range p.samples(0) {
		n += s.Count
		fs := rbFrames(s)
		if len(fs) < len(root) {
			other = append(other, s)
			continue
		}
		tail := fs[len(fs)-len(root):]
		ok := true
		for k, want := range root {
			ok = ok && tail[k].name == want
		}
		if !ok {
			other = append(other, s)
			continue
		}
		rooted += s.Count
		grind := tail[0].index
		// What runs above Spinner.grind: its C code, named from the extension.
		if grind > 0 && slices.ContainsFunc(s.Locations[:grind], func(l *trace.Location) bool {
			return l.Kind == trace.FrameNative && len(l.Lines) > 0 && l.Lines[0].Function == "grind"
		}) {
			switch {
			case len(fs) == len(root):
				inC += s.Count
			case len(fs) >= len(root)+2 && fs[0].name == "sift" && fs[1].name == "block in mill":
				inBlock += s.Count
			}
		}
	}
	if n < 50 {
		t.Fatalf("%d samples of the workload", n)
	}
	t.Logf("%d samples: %d with %s at the root, %d of them in the extension's C code, %d in the block it yields to",
		n, rooted, strings.Join(root, " <- "), inC, inBlock)
	if float64(rooted) < 0.95*float64(n) {
		logTopStacks(t, other, 6)
		t.Errorf("%.3f of samples hold %s, want 0.95", float64(rooted)/float64(n), strings.Join(root, " <- "))
	}
	// The C loop and the Ruby block each take a good share of the time.
	if float64(inC+inBlock) < 0.9*float64(rooted) || inC < n/10 || inBlock < n/10 {
		t.Errorf("%d in the extension's C code and %d in the block of %d: want both, 0.9 together", inC, inBlock, rooted)
	}
}
