package testenv

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Timeouts for waits: generous, because a test waits for a condition rather than sleeping,
// and on a busy host the condition comes later but still comes. A wait returns as soon as
// the condition holds, so a quiet host never pays for the margin.
const (
	// StartTimeout bounds waits for a program to get going (its first CPU time, a port).
	StartTimeout = 30 * time.Second
	// SampleTimeout bounds waits for a profile to collect enough samples.
	SampleTimeout = 90 * time.Second
)

// Poll is how often Wait checks its condition.
var Poll = 20 * time.Millisecond

// Wait checks cond every Poll until it reports done, and returns nil then. When timeout
// passes first it returns an error naming what it waited for and the state cond reported
// last, so that a failure says how far the condition got.
func Wait(what string, timeout time.Duration, cond func() (done bool, state string)) error {
	deadline := time.Now().Add(timeout)
	for {
		done, state := cond()
		if done {
			return nil
		}
		if !time.Now().Before(deadline) {
			if state == "" {
				state = "no state"
			}
			return fmt.Errorf("waited %v for %s; last seen: %s", timeout, what, state)
		}
		time.Sleep(Poll)
	}
}

// WaitFor is Wait that fails the test.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() (done bool, state string)) {
	t.Helper()
	if err := Wait(what, timeout, cond); err != nil {
		t.Fatal(err)
	}
}

// ProcessCPU is the user and system CPU time a process has used, from /proc/PID/stat.
func ProcessCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name is parenthesised and may hold spaces: fields count from after it,
	// where utime and stime are the 12th and 13th.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 > len(data) {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(data[i+2:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	const userHZ = 100 // USER_HZ, which /proc reports in on every Linux architecture
	return time.Duration(utime+stime) * time.Second / userHZ, nil
}

// WaitCPU waits until process pid has used at least d of CPU time: past its start-up and
// into its own work, however long the machine takes to give it that time.
func WaitCPU(t testing.TB, pid int, d time.Duration) {
	t.Helper()
	WaitFor(t, fmt.Sprintf("process %d to use %v of CPU", pid, d), StartTimeout, func() (bool, string) {
		used, err := ProcessCPU(pid)
		if err != nil {
			return false, err.Error()
		}
		return used >= d, fmt.Sprintf("%v of CPU", used)
	})
}

// Metric reads one value from a Prometheus text endpoint (sonde's /metrics): name is the
// series as the endpoint writes it, with its labels if it has any
// (sonde_unwind_walks_total{outcome="complete"}).
func Metric(url, name string) (float64, error) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		value, ok := strings.CutPrefix(line, name+" ")
		if !ok {
			continue
		}
		return strconv.ParseFloat(strings.TrimSpace(value), 64)
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s has no %s", url, name)
}
