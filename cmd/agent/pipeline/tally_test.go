package pipeline

import (
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/trace"
)

// TestTallyEnd: the end a person reads is a few lines: samples, processes, losses, and the
// share of frames left unnamed with the main reason.
func TestTallyEnd(t *testing.T) {
	lib := &trace.Mapping{Path: "/usr/lib/libstripped.so.1"}
	named := &trace.Location{Kind: trace.FrameNative, Lines: []trace.Line{{Function: "main"}}}
	stripped := &trace.Location{Kind: trace.FrameNative, Mapping: lib}
	kernel := &trace.Location{Kind: trace.FrameKernel}
	p1, p2 := &trace.Process{PID: 1}, &trace.Process{PID: 2}
	ta := newTally()
	ta.Add(&trace.Profile{Samples: []*trace.Sample{
		{Process: p1, Count: 3000, Locations: []*trace.Location{stripped, named}},
		{Process: p2, Count: 1000, Locations: []*trace.Location{kernel, named}},
	}})
	var b strings.Builder
	if err := ta.print(&b, 30*time.Second, 12); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"4 000 samples over 30.0s from 2 processes, 12 lost", "50.0% of frames unnamed, most in libstripped.so.1 (no symbols", "--log-level debug"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n > 4 {
		t.Errorf("%d lines:\n%s", n, out)
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1 000", 1234567: "1 234 567"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}
