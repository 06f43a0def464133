package bpf

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// TestVerifierBudget loads the sampling program with the verifier's statistics and logs how
// many instructions it processed, the figure each change to the walk is weighed by; it
// fails well before the kernel's million-instruction limit would.
func TestVerifierBudget(t *testing.T) {
	testenv.RequireRoot(t)
	spec, err := loadSampler()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"target_pids", "target_cgroups", "unwind_tables", "proc_maps", "exec_ids", "py_procs", "py_threads"} {
		if m := spec.Maps[name]; m != nil && m.MaxEntries == 0 {
			m.MaxEntries = 1
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			n := len(ve.Log)
			t.Fatalf("load: %s", strings.Join(ve.Log[max(0, n-40):], "\n"))
		}
		t.Fatalf("load: %v", err)
	}
	defer coll.Close()
	prog := coll.Programs["sample"]
	m := regexp.MustCompile(`processed (\d+) insns`).FindStringSubmatch(prog.VerifierLog)
	if m == nil {
		t.Fatalf("no instruction count in the verifier's log:\n%s", prog.VerifierLog)
	}
	n, _ := strconv.Atoi(m[1])
	depth := regexp.MustCompile(`stack depth [0-9+]+`).FindString(prog.VerifierLog)
	t.Logf("sample: processed %d insns, %s", n, depth)
	if n > 500_000 {
		t.Errorf("sample: the verifier processed %d instructions, half its limit", n)
	}
}
