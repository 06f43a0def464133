package main

import (
	"bufio"
	"cmp"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/trace"
)

// phpWorkload is testdata/phpworkload.php, by absolute path: stacks name it as their file.
func phpWorkload(t testing.TB) string {
	p, err := filepath.Abs("testdata/phpworkload.php")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// phpChains are the workload's modes and the PHP frames, leaf first, each holds while it
// runs its hot function.
var phpChains = map[string][]string{
	"pure":     {"Dock::count_crates", "Dock::unload", "harbor", "{main}"},
	"internal": {"compare_crates", "usort", "harbor_sorted", "{main}"},
	"closure":  {"{closure}", "array_map", "harbor_mapped", "{main}"},
}

var phpModes = []string{"pure", "internal", "closure"}

// phpEngines are how the workload runs PHP: opcache off (the VM's handlers), and opcache's
// JIT, tracing and per function.
var phpEngines = map[string][]string{
	"vm":       {"-d", "opcache.enable_cli=0"},
	"tracing":  {"-d", "opcache.enable_cli=1", "-d", "opcache.jit=tracing", "-d", "opcache.jit_buffer_size=32M"},
	"function": {"-d", "opcache.enable_cli=1", "-d", "opcache.jit=function", "-d", "opcache.jit_buffer_size=32M"},
}

var phpEngineNames = []string{"vm", "tracing", "function"}

// runtimeFrame is a frame of a language runtime in a sample, as the test reads it.
type runtimeFrame struct {
	name, file string
	line       int64
	index      int // in the sample's locations, leaf first
}

// runtimeFrames lists a sample's frames of one kind ("php", "ruby"), leaf first.
func runtimeFrames(s *trace.Sample, kind string) []runtimeFrame {
	var out []runtimeFrame
	for i, l := range s.Locations {
		if l.KindName() == kind && len(l.Lines) > 0 {
			out = append(out, runtimeFrame{name: l.Lines[0].Function, file: l.Lines[0].File, line: l.Lines[0].Line, index: i})
		}
	}
	return out
}

func phpFrames(s *trace.Sample) []runtimeFrame { return runtimeFrames(s, "php") }

// phpSpans returns the lines of each function of a PHP file written as the workload is:
// "function name(" opens one, a "}" at its indentation closes it; "{main}" is the file.
func phpSpans(t testing.TB, file string) map[string][2]int64 {
	open := regexp.MustCompile(`^(\s*)(?:\$\w+\s*=\s*)?(?:(?:public|private|protected|static)\s+)*function(?:\s+(\w+))?\s*\(`)
	return blockSpans(t, file, "{main}", open, "{closure}", "}", "};")
}

// blockSpans returns the lines of each block of a workload's source file: a line open
// matches starts one, its indentation the first group and its name the second (anonymous
// where empty); a line of one of the closers at that indentation ends it. whole names the
// file itself.
func blockSpans(t testing.TB, file, whole string, open *regexp.Regexp, anonymous string, closers ...string) map[string][2]int64 {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	spans := map[string][2]int64{}
	type pending struct {
		name, indent string
		start        int64
	}
	var stack []pending
	var line int64
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line++
		text := sc.Text()
		if m := open.FindStringSubmatch(text); m != nil {
			name := m[2]
			if name == "" {
				name = anonymous
			}
			stack = append(stack, pending{name, m[1], line})
			continue
		}
		if n := len(stack); n > 0 && slices.ContainsFunc(closers, func(c string) bool { return text == stack[n-1].indent+c }) {
			spans[stack[n-1].name] = [2]int64{stack[n-1].start, line}
			stack = stack[:n-1]
		}
	}
	spans[whole] = [2]int64{1, line}
	return spans
}

// TestPHPStacks profiles Debian 12's PHP 8.2 on the host and Debian sid's PHP 8.4 in a
// container, each with opcache off and with its JIT (tracing, and 8.2's per function),
// on workloads whose hot function is called from PHP or from an internal function
// (usort, array_map), and checks their stacks read as the program calls: PHP frames by
// name, file and line, the internal function's native code between its frame and the
// callback's, and complete down to the process's first native frame.
func TestPHPStacks(t *testing.T) {
	testenv.RequireRoot(t)
	type run struct {
		php    testenv.PHP
		engine string
		mode   string
	}
	var runs []run
	host, sid := testenv.HostPHP(t), testenv.DebianPHP(t)
	for _, p := range []testenv.PHP{host, sid} {
		for _, e := range phpEngineNames {
			if e == "function" && p.Root != "" {
				continue // one JIT mode is enough for the second version
			}
			for _, m := range phpModes {
				runs = append(runs, run{p, e, m})
			}
		}
	}
	var cmds = make([]*exec.Cmd, 0, len(runs))
	for _, r := range runs {
		args := append(slices.Clone(phpEngines[r.engine]), r.php.Script(t, phpWorkload(t)), r.mode, "120")
		if r.engine != "vm" {
			args = append(args, "jit") // the workload checks its JIT is on
		}
		cmds = append(cmds, r.php.Command(args...))
	}
	p := startGroup(t, 0, "ready", cmds...).profile(300)
	spans := phpSpans(t, phpWorkload(t))
	for i, r := range runs {
		t.Run(r.php.Name+"/"+r.engine+"/"+r.mode, func(t *testing.T) {
			samples := p.samples(i)
			file := r.php.Script(t, phpWorkload(t))
			chain := phpChains[r.mode]
			var n, good, between, complete int64
			for _, s := range samples {
				n += s.Count
				fs := phpFrames(s)
				if len(fs) < len(chain) {
					continue
				}
				ok := true
				for j, want := range chain {
					f := fs[j]
					name := f.name
					if strings.HasPrefix(name, "{closure") {
						name = "{closure}" // 8.4 names a closure by where it is
					}
					if name != want {
						ok = false
						break
					}
					if strings.HasPrefix(want, "{") && want != "{closure}" || j == 1 && r.mode != "pure" {
						continue // {main}'s line is the call's; an internal function has no file
					}
					span := spans[strings.TrimPrefix(want, "Dock::")]
					if f.file != file || f.line < span[0] || f.line > span[1] {
						ok = false
					}
				}
				if !ok {
					continue
				}
				good += s.Count
				if r.mode != "pure" && fs[1].index-fs[0].index > 1 {
					between += s.Count // the internal function's native code calls the callback
				}
				if root := fs[len(chain)-1].index; root+1 < len(s.Locations) && s.Locations[len(s.Locations)-1].KindName() == "native" {
					complete += s.Count
				}
			}
			if n < 50 {
				t.Fatalf("%d samples of the workload", n)
			}
			share := float64(good) / float64(n)
			t.Logf("%.3f of %d samples show %s with file and line; %d of them complete to the native root", share, n, strings.Join(chain, " <- "), complete)
			if share < 0.95 {
				logTopStacks(t, samples, 4)
				t.Errorf("%.3f of %d samples show %s with file and line, want 0.95", share, n, strings.Join(chain, " <- "))
			}
			if float64(complete) < 0.9*float64(good) {
				t.Errorf("%d of %d samples reach the native root below {main}, want 0.9", complete, good)
			}
			if r.mode != "pure" && float64(between) < 0.9*float64(good) {
				t.Errorf("%d of %d samples have native frames between %s and %s, want 0.9", between, good, chain[0], chain[1])
			}
		})
	}
}

// logTopStacks logs a process's most frequent stacks, root first, to show a failure.
func logTopStacks(t *testing.T, samples []*trace.Sample, n int) {
	t.Helper()
	counts := map[string]int64{}
	for _, s := range samples {
		var names []string
		for i := len(s.Locations) - 1; i >= 0; i-- {
			l := s.Locations[i]
			name := "?"
			if len(l.Lines) > 0 {
				name = l.Lines[0].Function
				if l.Lines[0].Line > 0 {
					name += ":" + strconv.FormatInt(l.Lines[0].Line, 10)
				}
			}
			names = append(names, name)
		}
		counts[strings.Join(names, ";")] += s.Count
	}
	keys := slices.SortedFunc(maps.Keys(counts), func(a, b string) int { return cmp.Compare(counts[b], counts[a]) })
	for _, k := range keys[:min(n, len(keys))] {
		t.Logf("%d %s", counts[k], k)
	}
}

// BenchmarkPHPSample measures the kernel's cost per sample of Debian 12's PHP 8.2 running
// the pure workload (four PHP frames over ten native ones), with opcache off and with its
// tracing JIT, against the native C workload's, as BenchmarkNodeSample does for V8.
func BenchmarkPHPSample(b *testing.B) {
	testenv.RequireRoot(b)
	p := testenv.HostPHP(b)
	ws := []sampleWorkload{{"native", []string{buildWorkload(b, "depth", depthC, "-O2", "-fomit-frame-pointer"), "60", "20"}}}
	for _, e := range []string{"vm", "tracing"} {
		ws = append(ws, sampleWorkload{"php-" + p.Version + "-" + e, append(append([]string{p.Path}, phpEngines[e]...), phpWorkload(b), "pure", "60")})
	}
	compareBPFPerSample(b, ws)
}
