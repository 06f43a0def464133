package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/reporter/top"
	"github.com/sonde-profiler/sonde/trace"
)

// sequences are the escape sequences the view itself writes.
var sequences = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// The view draws ranked, escaped names in place; keys re-rank and pause it.
func TestLiveViewDraws(t *testing.T) {
	var screen bytes.Buffer
	v := &liveView{out: bufio.NewWriter(&screen), fd: -1, window: top.NewWindow(10 * time.Second), title: "sonde top: test", waiting: true}
	v.draw()
	if !strings.Contains(screen.String(), "waiting for the first second") {
		t.Errorf("first screen:\n%q", screen.String())
	}
	loc := func(name string) *trace.Location { return &trace.Location{Lines: []trace.Line{{Function: name}}} }
	start := time.Unix(100, 0)
	v.Add(&trace.Profile{Start: start, End: start.Add(time.Second), Period: 10 * time.Millisecond, Samples: []*trace.Sample{
		{Process: &trace.Process{PID: 1}, Count: 3, Locations: []*trace.Location{loc("leaf"), loc("caller")}},
		{Process: &trace.Process{PID: 1}, Count: 1, Locations: []*trace.Location{loc("evil\x1b]0;x\x07"), loc("root"), loc("caller")}},
	}})
	frame := screen.String()[strings.LastIndex(screen.String(), "\x1b[H"):]
	plain := sequences.ReplaceAllString(frame, "")
	if strings.ContainsAny(strings.ReplaceAll(plain, "\r\n", ""), "\x00\x07\x1b\r\n") {
		t.Errorf("a name's control bytes reached the screen:\n%q", frame)
	}
	for _, want := range []string{" 75.00%  75.00%  leaf\x1b[K", ` 25.00%  25.00%  evil\x1b]0;x\x07`, "4 samples (0.04s of CPU) over 1.0s, 0 lost", "by self"} {
		if !strings.Contains(frame, want) {
			t.Errorf("no %q in the frame:\n%q", want, frame)
		}
	}
	if strings.Index(frame, "leaf") > strings.Index(frame, "caller") {
		t.Errorf("by self, leaf comes before caller:\n%q", frame)
	}
	if !v.key('c') {
		t.Fatal("c changed nothing")
	}
	v.draw()
	frame = screen.String()[strings.LastIndex(screen.String(), "\x1b[H"):]
	if !strings.Contains(frame, "by cumulative") || strings.Index(frame, "caller") > strings.Index(frame, "leaf") {
		t.Errorf("by cumulative, caller (100%%) leads:\n%q", frame)
	}
	v.key('p')
	v.Add(&trace.Profile{Start: start.Add(time.Second), End: start.Add(2 * time.Second), Samples: []*trace.Sample{{Process: &trace.Process{PID: 1}, Count: 100, Locations: []*trace.Location{loc("later")}}}})
	frame = screen.String()[strings.LastIndex(screen.String(), "\x1b[H"):]
	if !strings.Contains(frame, "[paused]") || strings.Contains(frame, "later") {
		t.Errorf("paused, the screen changed:\n%q", frame)
	}
	v.key(' ')
	v.draw()
	if frame = screen.String()[strings.LastIndex(screen.String(), "\x1b[H"):]; !strings.Contains(frame, "later") {
		t.Errorf("unpaused, the counting done meanwhile shows:\n%q", frame)
	}
	if v.key('x') {
		t.Error("an unknown key changed the view")
	}
}

func TestCgroupFilter(t *testing.T) {
	proc := t.TempDir()
	for pid, cg := range map[int]string{1: "0::/\n", 2: "0::/app.slice/web\n", 3: "0::/app.slice/web/worker\n", 4: "0::/app.slice/webby\n", 5: "12:memory:/app.slice/web\n0::/other\n"} {
		os.MkdirAll(filepath.Join(proc, strconv.Itoa(pid)), 0o755)
		os.WriteFile(filepath.Join(proc, strconv.Itoa(pid), "cgroup"), []byte(cg), 0o644)
	}
	f := &cgroupFilter{path: "/app.slice/web", procFS: proc}
	p := &trace.Profile{}
	for pid := uint32(1); pid <= 6; pid++ {
		p.Samples = append(p.Samples, &trace.Sample{Process: &trace.Process{PID: pid}, Count: 1})
	}
	var kept []uint32
	for _, s := range f.apply(p).Samples {
		kept = append(kept, s.Process.PID)
	}
	if fmt.Sprint(kept) != "[2 3]" {
		t.Errorf("kept pids %v, want [2 3] (web and below; not webby, not a v1 line, not a gone process)", kept)
	}
	if root := (&cgroupFilter{path: "/", procFS: proc}); len(root.apply(p).Samples) != 5 {
		t.Error("the root cgroup holds every process that has one")
	}
}

func TestCgroup2Mounts(t *testing.T) {
	info := filepath.Join(t.TempDir(), "mountinfo")
	os.WriteFile(info, []byte(`22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
31 22 0:27 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
42 31 0:39 / /sys/fs/cgroup/cpu rw,relatime shared:11 - cgroup cgroup rw,cpu
90 80 0:38 /kubepods/pod1 /mnt/my\040cgroup rw - cgroup2 cgroup2 rw
`), 0o644)
	got, err := cgroup2Mounts(info)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[{/ /sys/fs/cgroup/unified} {/kubepods/pod1 /mnt/my cgroup}]" {
		t.Errorf("mounts %v", got)
	}
}

func TestTailBufferKeepsTheLastLines(t *testing.T) {
	b := &tailBuffer{max: 20}
	for i := range 10 {
		fmt.Fprintf(b, "line %d\n", i)
	}
	if got := string(b.Bytes()); got != "line 8\nline 9\n" {
		t.Errorf("kept %q", got)
	}
}

// sonde top on a terminal shows a busy process's hot function within 3 s of starting,
// follows keys, and gives the terminal back as it found it when q is typed.
func TestTopShowsHotFunction(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildWorkload(t, "chain", chainC, "-O1", "-g", "-fno-omit-frame-pointer")
	w := startWorkload(t, bin, 60)
	sondeBin := sonde(t)
	cmd := exec.Command(sondeBin, "top", "--pid", strconv.Itoa(w.Process.Pid), "--duration", "30s")
	began := time.Now()
	term := startInTerminal(t, cmd, 30, 100)
	if !term.waitFor("%  c\x1b[K", 3*time.Second) {
		t.Fatalf("no row for c within 3 s:\n%q", term.output())
	}
	t.Logf("c shown %v after start", time.Since(began))
	term.typeKeys(t, "c")
	if !term.waitFor("by cumulative", 3*time.Second) {
		t.Errorf("c did not rank by cumulative samples:\n%q", term.output())
	}
	term.typeKeys(t, "q")
	term.wait(t, 10*time.Second)
	if err := cmd.Wait(); err != nil {
		t.Errorf("sonde top: %v", err)
	}
	out := term.output()
	if !strings.HasPrefix(out, "\x1b[?1049h\x1b[?25l") || !strings.HasSuffix(out, "\x1b[?25h\x1b[?1049l") {
		t.Errorf("the alternate screen and cursor were not both entered and restored:\n%q...%q", out[:min(len(out), 40)], out[max(0, len(out)-40):])
	}
}

// Ctrl-C quits too; --cgroup shows the processes of a cgroup v2 subtree.
func TestTopCgroupAndCtrlC(t *testing.T) {
	testenv.RequireRoot(t)
	mounts, err := cgroup2Mounts("/proc/self/mountinfo")
	if err != nil || len(mounts) == 0 {
		testenv.Unavailable(t, "needs a cgroup2 mount")
	}
	dir, err := os.MkdirTemp(mounts[0].dir, "sonde-test-")
	if err != nil {
		testenv.Unavailable(t, "cannot make a cgroup: %v", err)
	}
	bin := buildWorkload(t, "chain", chainC, "-O1", "-g", "-fno-omit-frame-pointer")
	w := startWorkload(t, bin, 60)
	t.Cleanup(func() {
		w.Process.Kill()
		w.Wait()
		os.Remove(dir)
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(w.Process.Pid)), 0); err != nil {
		t.Fatalf("move the workload into %s: %v", dir, err)
	}
	cmd := exec.Command(sonde(t), "top", "--cgroup", dir, "--duration", "30s")
	term := startInTerminal(t, cmd, 30, 100)
	if !term.waitFor("cgroup /"+filepath.Base(dir), 5*time.Second) || !term.waitFor("%  c\x1b[K", 5*time.Second) {
		t.Fatalf("no row for c:\n%q", term.output())
	}
	term.typeKeys(t, "\x03")
	term.wait(t, 10*time.Second)
	if err := cmd.Wait(); err != nil {
		t.Errorf("sonde top: %v", err)
	}
	if out := term.output(); !strings.HasSuffix(out, "\x1b[?25h\x1b[?1049l") {
		t.Errorf("terminal not restored after Ctrl-C:\n%q", out[max(0, len(out)-80):])
	}
}

// Mistakes, and a view with no terminal to draw on, exit 2 before anything is loaded.
func TestTopUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"top", "--window", "500ms"}, "--window 500ms"},
		{[]string{"top", "--sort", "name"}, `--sort "name"`},
		{[]string{"top", "--cgroup", "/no/such/cgroup"}, "--cgroup /no/such/cgroup"},
		{[]string{"top", "--pid", "x"}, "not a process ID"},
		{[]string{"top", "extra"}, "unexpected argument"},
		{[]string{"top"}, "needs a terminal"},
	} {
		_, stderr, err := runSonde(t, tc.args...)
		var exit *exec.ExitError
		if !errAs(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("sonde %q: %v, want exit status 2 saying %q:\n%s", tc.args, err, tc.want, stderr)
		}
	}
}
