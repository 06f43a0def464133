package bpf

import (
	"log/slog"
	"strings"
	"testing"
)

// The summary tells success from failure: complete walks by tables and by frame pointer,
// truncated ones, and every kind of failure under a name of its own.
func TestCountersLogValue(t *testing.T) {
	var c Counters
	c.UnwindEnds[UnwindComplete] = 10
	c.UnwindEnds[UnwindCompleteFP] = 5
	c.UnwindEnds[UnwindTruncated] = 2
	c.UnwindEnds[UnwindNoUser] = 7
	c.UnwindEnds[UnwindCFAExpression] = 3
	c.UnwindEnds[UnwindGoSwitch] = 1
	complete, fp, truncated, failed := c.Outcomes()
	if complete != 10 || fp != 5 || truncated != 2 || failed != 4 {
		t.Errorf("outcomes %d %d %d %d, want 10 5 2 4", complete, fp, truncated, failed)
	}
	var b strings.Builder
	slog.New(slog.NewTextHandler(&b, nil)).Info("summary", "kernel", c)
	for _, want := range []string{"unwind_complete=10", "unwind_complete_fp=5", "unwind_truncated=2", "unwind_failed=4",
		"unwind_cfa_expression=3", "unwind_go_switch=1", "unwind_no_user_stack=7"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary %q lacks %s", b.String(), want)
		}
	}
	for end := range UnwindEndCount {
		if UnwindEnd(end).String() == "unknown" {
			t.Errorf("end %d has no name", end)
		}
	}
}
