package main

import (
	"os/exec"
	"regexp"
	"strconv"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// The table's span is the run's, idle intervals included: a target idle for a 2 s run
// of 0.5 s intervals gives a table over about 2 s, not over nothing.
func TestTopTableSpansIdleIntervals(t *testing.T) {
	testenv.RequireRoot(t)
	idle := exec.Command("sleep", "30")
	if err := idle.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { idle.Process.Kill(); idle.Wait() }()
	stdout, stderr, err := runSonde(t, "--pid", strconv.Itoa(idle.Process.Pid), "--duration", "2s", "--interval", "500ms")
	if err != nil {
		t.Fatalf("sonde: %v\n%s", err, stderr)
	}
	m := regexp.MustCompile(`^no samples over (\d+\.\d)s\n`).FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("summary:\n%s", stdout)
	}
	if span, _ := strconv.ParseFloat(m[1], 64); span < 2 || span > 4 {
		t.Errorf("span %.1fs of a 2 s run", span)
	}
}
