package pipeline

import (
	"strings"
	"testing"
	"time"
)

func TestProgressLine(t *testing.T) {
	p := progress{elapsed: 12345 * time.Millisecond, duration: 30 * time.Second, samples: 1234, processes: 17, lost: 2}
	if got := p.line(0); got != "sonde: 12.3s / 30s  1234 samples  17 processes  2 lost" {
		t.Errorf("line %q", got)
	}
	p.duration = 0
	if got := p.line(20); got != "sonde: 12.3s  1234 s" {
		t.Errorf("without duration, cut to 20 columns: %q", got)
	}
}

// Log lines clear the status line first, so the two never share a line.
func TestStatusWriterClearsBeforeOutput(t *testing.T) {
	var out strings.Builder
	s := &statusWriter{w: &out}
	s.Write([]byte("first\n"))
	s.show("status 1")
	s.show("status 2")
	s.Write([]byte("log line\n"))
	s.show("status 3")
	s.clear()
	s.clear()
	want := "first\n\rstatus 1\x1b[K\rstatus 2\x1b[K\r\x1b[Klog line\n\rstatus 3\x1b[K\r\x1b[K"
	if out.String() != want {
		t.Errorf("got %q\nwant %q", out.String(), want)
	}
}
