package bpf

import (
	"errors"
	"regexp"
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
// a load that takes seconds.
const maxSampleInsns = 200_000

// TestVerifierBudget loads the programs as Load does and reports what verifying the
// sampler cost, so that a change to the walker that makes the verifier's work explode
// fails here rather than on a host whose kernel is a little stricter.
func TestVerifierBudget(t *testing.T) {
	testenv.RequireRoot(t)
	if err := CheckFeatures(); err != nil {
		testenv.Unavailable(t, "kernel cannot load the programs: %v", err)
	}
	spec, err := loadSampler()
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range []bool{true, false} {
		if err := spec.Variables["table_unwinding"].Set(boolByte(table)); err != nil {
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
		log := coll.Programs["sample"].VerifierLog
		coll.Close()
		m := regexp.MustCompile(`processed (\d+) insns`).FindStringSubmatch(log)
		if m == nil {
			t.Fatalf("no instruction count in the verifier's log:\n%s", log)
		}
		n, _ := strconv.Atoi(m[1])
		if table && n > maxSampleInsns {
			t.Errorf("verifying sample took %d instructions, over the budget of %d", n, maxSampleInsns)
		}
		t.Logf("table_unwinding=%v: sample verified in %d instructions; all programs loaded in %v", table, n, took)
	}
}
