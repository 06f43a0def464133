package testenv

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// Sonde is a running agent that a test watches through its /metrics and stops when it
// has what the test needs.
type Sonde struct {
	t      testing.TB
	cmd    *exec.Cmd
	args   []string
	stdout bytes.Buffer
	stderr bytes.Buffer
	exited chan struct{}
	err    error  // the exit status, once exited is closed
	url    string // of /metrics
	health string // of /healthz
}

// SondeRun is a finished run of the agent.
type SondeRun struct {
	Stdout, Stderr string
	Err            error // the exit status
}

// StartSonde starts the agent at bin with args and --metrics-addr on a free loopback port.
// args must not hold --metrics-addr; a --duration in them still ends the run, and without
// one the run is bounded at SampleTimeout and a minute more, should the test die before it
// can stop sonde.
func StartSonde(t testing.TB, bin string, args ...string) *Sonde {
	t.Helper()
	addr := freeAddr(t)
	args = append([]string{"--metrics-addr", addr, "--duration", (SampleTimeout + time.Minute).String()}, args...)
	s := &Sonde{t: t, cmd: exec.Command(bin, args...), args: args, exited: make(chan struct{}), url: "http://" + addr + "/metrics", health: "http://" + addr + "/healthz"}
	s.cmd.Stdout, s.cmd.Stderr = &s.stdout, &s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.err = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		s.cmd.Process.Kill()
		<-s.exited
	})
	return s
}

// Metric reads one of the agent's metrics, by its Prometheus name.
func (s *Sonde) Metric(name string) (float64, error) { return Metric(s.url, name) }

// WaitMetric waits until the metric reaches at least min. It returns false if the agent
// exited first (its targets exited, or it failed: Stop tells which), and fails the test
// naming the metric's last value if SampleTimeout passes.
func (s *Sonde) WaitMetric(name string, min float64) bool {
	s.t.Helper()
	return s.WaitUntil(fmt.Sprintf("%s >= %v", name, min), func() (bool, string) {
		v, err := s.Metric(name)
		if err != nil {
			return false, err.Error()
		}
		return v >= min, fmt.Sprintf("%s %v", name, v)
	})
}

// WaitUntil waits until cond holds while the agent runs, as WaitMetric does: false if the
// agent exited first, the test failed with cond's last state if SampleTimeout passes.
func (s *Sonde) WaitUntil(what string, cond func() (done bool, state string)) bool {
	s.t.Helper()
	exited := false
	err := Wait(fmt.Sprintf("sonde %v: %s", s.args, what), SampleTimeout, func() (bool, string) {
		select {
		case <-s.exited:
			exited = true
			return true, ""
		default:
		}
		return cond()
	})
	if err != nil {
		s.cmd.Process.Kill()
		<-s.exited // its output is complete, and no longer written to, only then
		s.t.Fatalf("%v\nstderr:\n%s", err, s.stderr.String())
	}
	return !exited
}

// WaitReady waits until the agent samples: /healthz answers once its programs are attached
// and it has read their ring buffer. As WaitMetric, it returns false if the agent exited.
func (s *Sonde) WaitReady() bool {
	s.t.Helper()
	return s.WaitUntil("/healthz to answer", func() (bool, string) {
		client := http.Client{Timeout: 5 * time.Second}
		resp, err := client.Get(s.health)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

// WaitSamples waits until the agent has recorded at least n samples (sonde_samples_total:
// samples of its targets only, the kernel filters the rest), as WaitMetric does. A test
// asserting on a profile then has as many samples as its statistics need, however slow or
// busy the host, and waits no longer than that on a quiet one.
func (s *Sonde) WaitSamples(n uint64) bool {
	s.t.Helper()
	return s.WaitMetric("sonde_samples_total", float64(n))
}

// Stop stops the agent with SIGINT, upon which it flushes its outputs as at the end of a
// --duration, and returns what it printed and how it exited.
func (s *Sonde) Stop() SondeRun {
	s.t.Helper()
	s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.exited:
	case <-time.After(StartTimeout):
		s.cmd.Process.Kill()
		<-s.exited
		s.t.Fatalf("sonde did not stop within %v of SIGINT\nstderr:\n%s", StartTimeout, s.stderr.String())
	}
	return SondeRun{s.stdout.String(), s.stderr.String(), s.err}
}

// RunSondeUntil runs the agent until it has recorded at least samples samples, then stops
// it as Stop does.
func RunSondeUntil(t testing.TB, bin string, samples uint64, args ...string) SondeRun {
	t.Helper()
	s := StartSonde(t, bin, args...)
	s.WaitSamples(samples)
	return s.Stop()
}

// freeAddr is a loopback address with a port nothing listens on at the moment.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
