package main

import (
	"cmp"
	"debug/elf"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
)

// goThreadRoots are the functions a complete Go stack ends in: a goroutine's goexit, a
// thread's mstart (rt0_go on the main thread before it), and the scheduler's g0 frames
// that run for no goroutine, entered through mcall or a preempting morestack.
var goThreadRoots = map[string]bool{"runtime.goexit": true, "runtime.mstart": true, "runtime.rt0_go": true, "runtime.mcall": true, "runtime.morestack": true}

// profileFor runs argv, profiles it with sonde until it has samples samples of the
// process, and returns the profile and sonde's stderr.
func profileFor(t *testing.T, samples uint64, argv ...string) (*profile.Profile, string) {
	t.Helper()
	sonde(t) // built before the workload starts, whose seconds must not run out meanwhile
	cmd := exec.Command(argv[0], argv[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	testenv.WaitCPU(t, cmd.Process.Pid, 100*time.Millisecond) // past the runtime's start-up
	out := filepath.Join(t.TempDir(), "p.pb.gz")
	r := runSondeUntil(t, samples, "--pid", strconv.Itoa(cmd.Process.Pid), "--output", out, "--top", "0")
	if r.Err != nil {
		t.Fatalf("sonde: %v\n%s", r.Err, r.Stderr)
	}
	return readProfile(t, out), r.Stderr
}

// outermost is a sample's outermost user function.
func outermost(s *profile.Sample) string {
	for i := len(s.Location) - 1; i >= 0; i-- {
		l := s.Location[i]
		if l.Mapping != nil && l.Mapping.File == "[kernel.kallsyms]" {
			continue
		}
		if len(l.Line) == 0 {
			return fmt.Sprintf("%#x", l.Address)
		}
		return l.Line[len(l.Line)-1].Function.Name
	}
	return ""
}

// A Go program whose garbage collector takes a third of its CPU runs much of it on g0
// stacks: through runtime.systemstack, morestack and mcall. Nearly every sample must
// still end at a thread's root, with today's Go and with an older release, and a
// sample through systemstack must go on from it to the function that called it, not to
// a word of systemstack's own frame read as a return address.
func TestGoStackSwitches(t *testing.T) {
	testenv.RequireRoot(t)
	for _, toolchain := range []string{"", "go1.23.4"} {
		t.Run("go"+strings.TrimPrefix(toolchain, "go"), func(t *testing.T) {
			bin := testprog.BuildGoWith(t, testprog.GoGC, toolchain, "CGO_ENABLED=0")
			// 600 samples: a share of 0.99 means something from 100 on, and a third in the
			// collector is then known to within ±0.04 (two standard errors). Each program
			// alone: the collector's share of a Go program's time depends on the cores it
			// gets, which a group would share.
			p, stderr := profileFor(t, 600, bin, "120")
			var total, rooted, gc, switched, switchedNamed int64
			roots := map[string]int64{}
			callers := map[string]int64{}
			for _, s := range p.Sample {
				n := s.Value[0]
				total += n
				if caller, ok := systemstackCaller(s); ok {
					switched += n
					if caller != "" {
						switchedNamed += n
					} else {
						callers[fmt.Sprintf("%#x", s.Location[slices.IndexFunc(s.Location, isSystemstack)+1].Address)] += n
					}
				}
				root := outermost(s)
				if goThreadRoots[root] {
					rooted += n
				} else {
					roots[root] += n
				}
				for _, name := range names(s) {
					if strings.HasPrefix(name, "runtime.gcBgMarkWorker") || strings.HasPrefix(name, "runtime.gcAssistAlloc") ||
						strings.HasPrefix(name, "runtime.bgsweep") || strings.HasPrefix(name, "runtime.markroot") {
						gc += n
						break
					}
				}
			}
			if total < 150 {
				t.Fatalf("only %d samples in the profile, where sonde counted at least 600", total)
			}
			share, gcShare := float64(rooted)/float64(total), float64(gc)/float64(total)
			if gcShare < 1.0/3 {
				t.Errorf("garbage collection in %.3f of the samples, want a third at least", gcShare)
			}
			if share < 0.99 {
				t.Errorf("%.4f of %d samples end at a thread's root, want 0.99; the others end at %v", share, total, roots)
			}
			// The mark workers run on g0 through systemstack for all of their time.
			if switched < 20 {
				t.Errorf("only %d samples through runtime.systemstack", switched)
			} else if share := float64(switchedNamed) / float64(switched); share < 0.99 {
				t.Errorf("%.4f of %d samples through runtime.systemstack go on to a named caller, want 0.99; others to %v", share, switched, callers)
			}
			if m := regexp.MustCompile(`unwind_failed=(\d+)`).FindStringSubmatch(stderr); m == nil {
				t.Errorf("no unwind outcomes in the summary:\n%s", stderr)
			}
			t.Logf("%d samples, %.4f rooted, %.3f in the garbage collector, %d through systemstack (%d to a named caller); not rooted: %v", total, share, gcShare, switched, switchedNamed, roots)
		})
	}
}

func isSystemstack(l *profile.Location) bool {
	return len(l.Line) > 0 && l.Line[len(l.Line)-1].Function.Name == "runtime.systemstack"
}

// systemstackCaller names the frame a sample reads after runtime.systemstack, on the
// goroutine's stack: "" when that frame is not named; false when the sample did not switch.
func systemstackCaller(s *profile.Sample) (string, bool) {
	i := slices.IndexFunc(s.Location, isSystemstack)
	if i < 0 || i+1 >= len(s.Location) {
		return "", false
	}
	if next := s.Location[i+1]; len(next.Line) > 0 {
		return next.Line[0].Function.Name, true
	}
	return "", true
}

// Go's signal handler runs on the thread's signal stack; its samples read through
// runtime.sigtramp and the ucontext back to the interrupted goroutine or g0, and end at a
// thread's root like the rest.
func TestGoSignalStack(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testprog.BuildGoWith(t, testprog.GoSignals, "", "CGO_ENABLED=0")
	// The handler takes 4-6 % of the samples on a machine of its own, and once 1.3 % under
	// the whole suite beside a CPU hog: enough samples that the tail still has tens.
	p, _ := profileFor(t, 1500, bin, "120")
	var total, rooted, handler, handlerRooted int64
	for _, s := range p.Sample {
		n := s.Value[0]
		total += n
		root := goThreadRoots[outermost(s)]
		if root {
			rooted += n
		}
		if containsInOrder(names(s), []string{"runtime.sigtramp"}) {
			handler += n
			if root {
				handlerRooted += n
			}
		}
	}
	if handler < 10 {
		t.Fatalf("only %d of %d samples in the signal handler", handler, total)
	}
	if share := float64(rooted) / float64(total); share < 0.99 {
		t.Errorf("%.4f of %d samples end at a thread's root, want 0.99", share, total)
	}
	if share := float64(handlerRooted) / float64(handler); share < 0.99 {
		t.Errorf("%.4f of %d samples in the signal handler end at a thread's root, want 0.99", share, handler)
	}
	t.Logf("%d samples, %d in the signal handler; %.4f rooted", total, handler, float64(rooted)/float64(total))
}

// Go calling C calling Go: a sample in the callback reads the whole chain, through cgo's
// switch to g0 (asmcgocall) and back to the goroutine (cgocallback), with the C frames
// between walked by their .eh_frame. The frames are named here from the binary's symbol
// table, by address, so that the test is of the walk alone.
func TestGoCgoCallbackChain(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireTool(t, "gcc")
	toolchains := []string{"", "go1.23.4"}
	var bins []string
	var cmds []*exec.Cmd
	for _, toolchain := range toolchains {
		bins = append(bins, testprog.BuildGoWith(t, testprog.GoCgo, toolchain, "CGO_ENABLED=1"))
		cmds = append(cmds, exec.Command(bins[len(bins)-1], "120"))
	}
	// The callback takes most of the time: 400 samples hold well over the 100 that a
	// share of 0.95 needs to mean something.
	profiled := startGroup(t, 100*time.Millisecond, "", cmds...).profile(400)
	for i, toolchain := range toolchains {
		t.Run("go"+strings.TrimPrefix(toolchain, "go"), func(t *testing.T) {
			bin, p := bins[i], profiled.profileOf(i)
			symbol := symbolizer(t, bin)
			// goSpinHot is inlined into the callback's exported wrapper.
			chain := []string{"_cgoexp_*_goSpinHot", "runtime.cgocallback", "cgo_inner", "cgo_outer", "runtime.asmcgocall", "main.callC", "main.main", "runtime.goexit"}
			var n, whole int64
			var broken []string
			for _, s := range p.Sample {
				var fs []string
				for i, l := range s.Location {
					if l.Mapping == nil || l.Mapping.File != bin {
						continue
					}
					addr := l.Address
					if i > 0 {
						addr-- // a return address: the call is before it
					}
					fs = append(fs, symbol(addr))
				}
				if len(fs) == 0 || fs[0] != chain[0] {
					continue
				}
				n += s.Value[0]
				if containsInOrder(fs, chain) {
					whole += s.Value[0]
				} else if len(broken) < 3 {
					broken = append(broken, strings.Join(fs, " <- "))
				}
			}
			if n < 100 {
				t.Fatalf("only %d samples in the callback", n)
			}
			if share := float64(whole) / float64(n); share < 0.95 {
				t.Errorf("%.3f of %d samples in the callback read %v; some read:\n%s", share, n, chain, strings.Join(broken, "\n"))
			}
			t.Logf("%d of %d samples in the callback read the whole chain", whole, n)
		})
	}
}

// symbolizer names the addresses of a non-PIE binary from its symbol table, without
// ABI suffixes, and the exported callbacks of cgo without their package hash.
func symbolizer(t *testing.T, bin string) func(uint64) string {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	funcs := slices.DeleteFunc(syms, func(s elf.Symbol) bool { return elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Value == 0 })
	slices.SortFunc(funcs, func(a, b elf.Symbol) int { return cmp.Compare(a.Value, b.Value) })
	hash := regexp.MustCompile(`^_cgoexp_[0-9a-f]+_`)
	return func(addr uint64) string {
		i, _ := slices.BinarySearchFunc(funcs, addr+1, func(s elf.Symbol, a uint64) int { return cmp.Compare(s.Value, a) })
		if i == 0 || (funcs[i-1].Size > 0 && addr >= funcs[i-1].Value+funcs[i-1].Size) {
			return fmt.Sprintf("%#x", addr)
		}
		return hash.ReplaceAllString(strings.TrimSuffix(funcs[i-1].Name, ".abi0"), "_cgoexp_*_")
	}
}

// Hand-written assembly whose CFA is a DW_CFA_def_cfa_expression (OpenSSL's forms,
// written with .cfi_escape): as a caller (*(rsp+8)+8) and as a leaf that needs r9 from
// the interrupted registers (*(rsp+8+r9*8)+8), nearly every sample reaches main; so do
// gcc's stack realignment's.
func TestUnwindCFAExpressions(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testprog.BuildStacks(t, "-O2", "-fomit-frame-pointer")
	modes := []string{"deref", "index", "drap"}
	var cmds []*exec.Cmd
	for _, mode := range modes {
		cmds = append(cmds, exec.Command(bin, "120", mode))
	}
	// Two hot functions share the time in the deref mode: 500 samples give each of them
	// well over the 50 the assertion needs.
	profiled := startGroup(t, 100*time.Millisecond, "", cmds...).profile(500)
	for _, tc := range []struct{ mode, hot string }{
		{"deref", "deref_callee_hot"},
		{"deref", "expr_deref"},
		{"index", "expr_index"},
		{"drap", "drap_leaf_hot"},
	} {
		t.Run(tc.mode+"/"+tc.hot, func(t *testing.T) {
			p := profiled.profileOf(slices.Index(modes, tc.mode))
			share, n := reachShare(p, tc.hot)
			if n < 50 {
				t.Fatalf("only %d samples in %s", n, tc.hot)
			}
			if share < 0.99 {
				t.Errorf("%.3f of %d samples in %s reach main, want 0.99", share, n, tc.hot)
			}
			t.Logf("%s: %.4f of %d samples reach main", tc.hot, share, n)
		})
	}
}
