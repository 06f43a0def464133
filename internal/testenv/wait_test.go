package testenv

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

func TestWaitReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	began := time.Now()
	err := Wait("the third call", time.Hour, func() (bool, string) {
		calls++
		return calls == 3, fmt.Sprintf("%d calls", calls)
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 3 {
		t.Errorf("condition checked %d times, want exactly 3: Wait must return as soon as it holds", calls)
	}
	// Two polls apart from the first check; an hour's timeout must not be what ends it.
	if took := time.Since(began); took > time.Minute {
		t.Errorf("Wait took %v for a condition that held at the third check", took)
	}
}

func TestWaitNamesWhatItWaitedFor(t *testing.T) {
	err := Wait("200 samples of pid 42", 50*time.Millisecond, func() (bool, string) {
		return false, "117 samples"
	})
	if err == nil {
		t.Fatal("Wait returned nil for a condition that never held")
	}
	for _, want := range []string{"200 samples of pid 42", "117 samples", "50ms"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestWaitChecksOnceMoreAtTheDeadline(t *testing.T) {
	// A condition that holds by the time the deadline passes counts: the last check comes
	// after the deadline, not before it.
	start := time.Now()
	err := Wait("a condition that holds late", 30*time.Millisecond, func() (bool, string) {
		return time.Since(start) >= 30*time.Millisecond, ""
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestProcessCPU(t *testing.T) {
	// Burn CPU in this process until /proc shows it, bounded by the wait's own deadline.
	before, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var sink uint64
	WaitFor(t, "this process to use 50ms more CPU", StartTimeout, func() (bool, string) {
		for i := range 1 << 20 {
			sink = sink*31 + uint64(i)
		}
		used, err := ProcessCPU(os.Getpid())
		if err != nil {
			return false, err.Error()
		}
		return used-before >= 50*time.Millisecond, (used - before).String()
	})
	if _, err := ProcessCPU(1 << 30); err == nil {
		t.Error("ProcessCPU of a pid that cannot exist returned no error")
	}
	_ = sink
}

func TestMetric(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# HELP sonde_samples_total x\n# TYPE sonde_samples_total counter\n"+
			"sonde_samples_lost_total 3\nsonde_samples_total 1234\n")
	}))
	defer srv.Close()
	if v, err := Metric(srv.URL, "sonde_samples_total"); err != nil || v != 1234 {
		t.Errorf("sonde_samples_total = %v, %v; want 1234", v, err)
	}
	if _, err := Metric(srv.URL, "sonde_missing"); err == nil || !strings.Contains(err.Error(), "sonde_missing") {
		t.Errorf("missing metric: %v", err)
	}
}
