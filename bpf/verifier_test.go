package bpf

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// TestVerifierBudget loads the programs with the verifier's statistics and reports how
// many instructions it processed for each: the sampling program has to stay well inside
// the verifier's budget of a million, and every change to it should say what it costs.
func TestVerifierBudget(t *testing.T) {
	testenv.RequireRoot(t)
	spec, err := loadSampler()
	if err != nil {
		t.Fatal(err)
	}
	var objs samplerObjects
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}}); err != nil {
		t.Fatalf("load: %v", err)
	}
	defer objs.Close()
	re := regexp.MustCompile(`processed (\d+) insns`)
	for name, p := range map[string]*ebpf.Program{"sample": objs.Sample, "on_exec": objs.OnExec, "on_exit": objs.OnExit, "on_fork": objs.OnFork} {
		m := re.FindStringSubmatch(p.VerifierLog)
		if m == nil {
			t.Errorf("%s: no instruction count in the verifier's log:\n%s", name, p.VerifierLog)
			continue
		}
		n, _ := strconv.Atoi(m[1])
		if n > 500_000 {
			t.Errorf("%s: the verifier processed %d instructions, half its budget", name, n)
		}
		t.Logf("%s: processed %d insns", name, n)
		if testing.Verbose() {
			t.Log(p.VerifierLog)
		}
	}
}
