package pipeline

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/reporter/top"
	"github.com/sonde-profiler/sonde/trace"
)

func TestIdleNote(t *testing.T) {
	period := time.Second / 19
	for _, tc := range []struct {
		name     string
		hostWide bool
		samples  int64
		span     time.Duration
		want     string // "" for no note
	}{
		// make run on an idle host: 4 samples at 19 Hz over 30 s on 2 CPUs.
		{"idle host", true, 4, 30 * time.Second, "busy 0.4% of the 30.0s"},
		{"no samples at all", true, 0, 30 * time.Second, "busy 0.0%"},
		// Half a core busy of two: 25 %, not idle.
		{"busy host", true, 285, 30 * time.Second, ""},
		// Just under the line: 4.9 %.
		{"nearly idle", true, 55, 30 * time.Second, "busy 4.8%"},
		// A --pid or record run reports an idle target as it is, without this advice.
		{"named targets", false, 4, 30 * time.Second, ""},
		{"no span", true, 4, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := idleNote(tc.hostWide, tc.samples, period, tc.span, 2)
			if tc.want == "" {
				if got != "" {
					t.Errorf("note %q, want none", got)
				}
				return
			}
			for _, want := range []string{tc.want, "nearly idle", "sonde record -- COMMAND", "--pid PID"} {
				if !strings.Contains(got, want) {
					t.Errorf("note %q lacks %q", got, want)
				}
			}
		})
	}
}

// The top table of a host-wide run says under it that the host was idle.
func TestTopSinkSaysTheHostWasIdle(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	p := &trace.Profile{Start: start, End: start.Add(30 * time.Second), Period: time.Second / 19}
	for _, hostWide := range []bool{true, false} {
		var out bytes.Buffer
		s := &topSink{table: top.NewTable(), n: 5, out: &out, hostWide: hostWide}
		s.Add(p)
		if err := s.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(out.String(), "nearly idle"); got != hostWide {
			t.Errorf("host-wide %v: idle note shown %v:\n%s", hostWide, got, out.String())
		}
	}
}
