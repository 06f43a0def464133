package testenv

import (
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Debuginfod runs elfutils' debuginfod on a free port of 127.0.0.1, indexing dir, and
// waits until it serves the debug file of buildID. kill stops it (the test's end does
// too). Without the debuginfod program the test skips, or fails under CI.
func Debuginfod(t testing.TB, dir, buildID string) (url string, kill func()) {
	t.Helper()
	bin := RequireTool(t, "debuginfod")
	for attempt := 0; ; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		// -F: index the ELF files under dir; -d: its database, not one in $HOME.
		cmd := exec.Command(bin, "-F", dir, "-p", fmt.Sprint(port), "-d", filepath.Join(t.TempDir(), "db.sqlite"))
		out := &lockedBuilder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		var once sync.Once
		kill = func() {
			once.Do(func() {
				cmd.Process.Kill()
				<-exited
			})
		}
		t.Cleanup(kill)
		url = fmt.Sprintf("http://127.0.0.1:%d", port)
		if serving(t, url, buildID, exited, out, attempt < 3) {
			return url, kill
		}
	}
}

// serving polls until the server answers for buildID; false if it exited and may be
// started again (its port was taken meanwhile).
func serving(t testing.TB, url, buildID string, exited chan struct{}, out *lockedBuilder, retry bool) bool {
	t.Helper()
	client := http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-exited:
			if retry {
				return false
			}
			t.Fatalf("debuginfod exited:\n%s", out.String())
		default:
		}
		if resp, err := client.Get(url + "/buildid/" + buildID + "/debuginfo"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("debuginfod did not serve %s within 2 minutes:\n%s", buildID, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
