package bpf

import (
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// maxSampleInsns bounds the instructions the verifier may process for the sample
// program. The kernel's limit is a million; a change that multiplies the verifier's
// states (a variable holding a map value in one branch and a scalar in another) shows
// up here as a jump by an order of magnitude long before it reaches that limit, and as
// a load that takes seconds. Verifying was the largest part of sonde's start-up: 105 000
// instructions took 98 ms, a third of its CPU in its first 4.5 s beside the side-by-side
// workloads, until the JIT walk and the frame-pointer step became global functions
// (16 000 instructions).
const maxSampleInsns = 40_000

// maxProgramInsns bounds every other program at half the kernel's budget of a million.
const maxProgramInsns = 500_000

// TestVerifierBudget loads the programs as Load does and reports what verifying each of
// them cost, so that a change to the walker or to what a sample reads beside it (the
// trace context) that makes the verifier's work explode fails here rather than on a host
// whose kernel is a little stricter; every change to them should say what it costs.
func TestVerifierBudget(t *testing.T) {
	testenv.RequireRoot(t)
	if err := CheckFeatures(); err != nil {
		testenv.Unavailable(t, "kernel cannot load the programs: %v", err)
	}
	spec, err := loadSampler()
	if err != nil {
		t.Fatal(err)
	}
	// Load sizes the maps it sizes; unsized, they load with one entry, which verifies the same.
	for _, m := range spec.Maps {
		if m.MaxEntries == 0 {
			m.MaxEntries = 1
		}
	}
	re := regexp.MustCompile(`processed (\d+) insns`)
	// The stack each function of a program takes (the sample program's, its loop
	// callbacks', its global functions'): the trace context read and the Python walk must
	// keep to the BPF stack's 512 bytes beside the unwinder.
	depthRe := regexp.MustCompile(`stack depth [0-9+]+`)
	for _, table := range []bool{true, false} {
		if err := spec.Variables["table_unwinding"].Set(boolByte(table)); err != nil {
			t.Fatal(err)
		}
		// As NewSampler sets them: mappings are named where tables are walked.
		if err := spec.Variables["vma_hints"].Set(boolByte(table)); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}})
		took := time.Since(began)
		if err != nil {
			var verr *ebpf.VerifierError
			if errors.As(err, &verr) {
				t.Fatalf("load with table_unwinding=%v: %v\n%s", table, err, strings.Join(verr.Log, "\n"))
			}
			t.Fatalf("load with table_unwinding=%v: %v", table, err)
		}
		names := make([]string, 0, len(coll.Programs))
		for name := range coll.Programs {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			log := coll.Programs[name].VerifierLog
			m := re.FindStringSubmatch(log)
			if m == nil {
				t.Errorf("table_unwinding=%v: %s: no instruction count in the verifier's log:\n%s", table, name, log)
				continue
			}
			n, _ := strconv.Atoi(m[1])
			if n > maxProgramInsns {
				t.Errorf("table_unwinding=%v: %s: the verifier processed %d instructions, half its budget", table, name, n)
			}
			if name == "sample" && table && n > maxSampleInsns {
				t.Errorf("verifying sample took %d instructions, over the budget of %d", n, maxSampleInsns)
			}
			t.Logf("table_unwinding=%v: %s verified in %d instructions, %s", table, name, n, depthRe.FindString(log))
			if testing.Verbose() {
				t.Log(log)
			}
		}
		coll.Close()
		t.Logf("table_unwinding=%v: all programs loaded in %v", table, took)
	}
}
