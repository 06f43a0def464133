package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// terminal is a pseudo-terminal a test runs sonde on, as a person would: the program gets
// the terminal as its standard streams and controlling terminal, the test reads what it
// draws and types keys.
type terminal struct {
	ptm  *os.File
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

// startInTerminal starts cmd on a new rows×cols pseudo-terminal.
func startInTerminal(t *testing.T, cmd *exec.Cmd, rows, cols uint16) *terminal {
	t.Helper()
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	ptm := os.NewFile(uintptr(fd), "/dev/ptmx")
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty: %v", err)
	}
	if err := unix.IoctlSetWinsize(int(pts.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatalf("set pty size: %v", err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, pts, pts
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pts.Close() // the program holds it now: reads end when it exits
	term := &terminal{ptm: ptm, done: make(chan struct{})}
	go func() {
		defer close(term.done)
		buf := make([]byte, 4096)
		for {
			n, err := ptm.Read(buf)
			term.mu.Lock()
			term.out.Write(buf[:n])
			term.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		ptm.Close()
	})
	return term
}

// output is everything drawn so far.
func (term *terminal) output() string {
	term.mu.Lock()
	defer term.mu.Unlock()
	return term.out.String()
}

// waitFor waits until the output contains s, for at most d; it reports whether it did.
func (term *terminal) waitFor(s string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if strings.Contains(term.output(), s) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-term.done:
			return strings.Contains(term.output(), s)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// typeKeys writes keys as if typed.
func (term *terminal) typeKeys(t *testing.T, keys string) {
	t.Helper()
	if _, err := term.ptm.WriteString(keys); err != nil {
		t.Fatalf("type %q: %v", keys, err)
	}
}

// wait waits for the program to finish drawing: its end of the terminal closed.
func (term *terminal) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-term.done:
	case <-time.After(d):
		t.Fatalf("still running after %v; drew:\n%q", d, term.output())
	}
}
