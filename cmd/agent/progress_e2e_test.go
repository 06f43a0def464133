package main

import (
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// On a terminal sonde shows its progress while it samples and clears it before the
// table; the counters move.
func TestProgressOnTerminal(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "chain", chainC, "-O2", "-fno-omit-frame-pointer")
	w := startWorkload(t, bin, 30)
	cmd := exec.Command(sonde(t), "--pid", strconv.Itoa(w.Process.Pid), "--duration", "2s", "--top", "3", "--log-level", "warn")
	term := startInTerminal(t, cmd, 24, 100)
	term.wait(t, 20*time.Second)
	out := term.output()
	lines := regexp.MustCompile(`\rsonde: [0-9.]+m?s / 2s  (\d+) samples  1 processes  0 lost\x1b\[K`).FindAllStringSubmatch(out, -1)
	if len(lines) < 3 {
		t.Fatalf("%d progress lines in:\n%q", len(lines), out)
	}
	if last, _ := strconv.Atoi(lines[len(lines)-1][1]); last == 0 {
		t.Errorf("the sample count never moved: %q", lines)
	}
	table := strings.Index(out, "self%")
	if table < 0 || !strings.Contains(out[:table], "\x1b[K\r\x1b[K") || strings.Contains(out[table:], "\rsonde: ") {
		t.Errorf("progress not cleared before the table:\n%q", out)
	}
}

// Not on a terminal, sonde draws nothing: logs and pipes get lines, not redraws.
func TestNoProgressOffTerminal(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "chain", chainC, "-O2", "-fno-omit-frame-pointer")
	w := startWorkload(t, bin, 30)
	stdout, stderr, err := runSonde(t, "--pid", strconv.Itoa(w.Process.Pid), "--duration", "1s", "--top", "3")
	if err != nil {
		t.Fatalf("sonde: %v\n%s", err, stderr)
	}
	if strings.ContainsAny(stdout+stderr, "\r\x1b") {
		t.Errorf("redraws off a terminal:\n%q\n%q", stdout, stderr)
	}
}

// On a terminal the run ends with the table and a few lines a person reads (samples,
// processes, losses, unnamed frames and why), not the summary's hundreds of counters,
// which go to the debug log.
func TestTerminalEnd(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "chain", chainC, "-O2", "-fno-omit-frame-pointer")
	w := startWorkload(t, bin, 30)
	cmd := exec.Command(sonde(t), "--pid", strconv.Itoa(w.Process.Pid), "--duration", "2s", "--top", "3")
	term := startInTerminal(t, cmd, 24, 120)
	term.wait(t, 20*time.Second)
	out := strings.ReplaceAll(term.output(), "\r\n", "\n")
	table := strings.Index(out, "self%")
	if table < 0 {
		t.Fatalf("no table:\n%s", out)
	}
	end := out[table:]
	if strings.Contains(out, "msg=summary") {
		t.Errorf("the summary's counters on a terminal:\n%s", out)
	}
	if !regexp.MustCompile(`sonde: [0-9 ]+ samples over [0-9.]+s from 1 process, [0-9 ]+ lost\n`).MatchString(end) ||
		!strings.Contains(end, "of frames unnamed") && !strings.Contains(end, "every frame named") {
		t.Errorf("no short summary after the table:\n%s", end)
	}
	// The header, three rows, and the end.
	if n := strings.Count(strings.TrimRight(end, "\n"), "\n") + 1; n > 4+10 {
		t.Errorf("%d lines from the table on, want the table and under 10 more:\n%s", n, end)
	}
}
