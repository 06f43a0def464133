package deploy

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// The uids of TestCapabilities: sonde runs as nobody, the workload as another user.
const (
	sondeUID    = 65534
	workloadUID = 1000
)

// TestCapabilities runs the built sonde as uid 65534 with only the deployed capability
// set, as the DaemonSet and the systemd unit do, against a workload of another user
// in its own mount namespace whose binary sits in a directory only that user may
// search: like a container's process, its file is reachable only through
// /proc/PID/root. With the set, the workload's function is named in the profile;
// without CAP_SYS_PTRACE sonde runs but cannot read the file; without CAP_BPF it fails.
func TestCapabilities(t *testing.T) {
	testenv.RequireRoot(t)
	sonde := requireBinary(t)
	setpriv := testenv.RequireTool(t, "setpriv")
	unshare := testenv.RequireTool(t, "unshare")
	gcc := testenv.RequireTool(t, "gcc")

	work := t.TempDir()
	busy := filepath.Join(work, "busy")
	if out, err := exec.Command(gcc, "-O1", "-g", "-fno-omit-frame-pointer", "-o", busy, "testdata/busy.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	mnt, out := namespaceDirs(t, work)
	script := strings.Join([]string{
		"set -e",
		"mount -t tmpfs -o mode=755 none " + mnt,
		"mkdir " + mnt + "/private",
		"cp " + busy + " " + mnt + "/private/busy",
		"chown -R " + strconv.Itoa(workloadUID) + ":" + strconv.Itoa(workloadUID) + " " + mnt + "/private",
		"chmod 700 " + mnt + "/private",
		"exec " + setpriv + " --reuid " + strconv.Itoa(workloadUID) + " --regid " + strconv.Itoa(workloadUID) + " --clear-groups " + mnt + "/private/busy",
	}, "\n")
	startPrivate(t, unshare, script, mnt+"/private/busy")

	run := func(name string, caps []string) (string, error) {
		file := filepath.Join(out, name+".pb.gz")
		b, err := sondeWith(setpriv, sonde, caps, "--duration", "4s", "--top", "0", "--output", file).CombinedOutput()
		if err != nil {
			return string(b), err
		}
		return file, nil
	}

	t.Run("deployed set", func(t *testing.T) {
		file, err := run("deployed", wantCaps)
		if err != nil {
			t.Fatalf("sonde with %v: %v\n%s", wantCaps, err, file)
		}
		if n := samplesIn(t, file, "sonde_cap_burn"); n == 0 {
			t.Errorf("no sample of the workload's sonde_cap_burn in the profile")
		}
	})

	t.Run("without SYS_PTRACE", func(t *testing.T) {
		caps := without(wantCaps, "SYS_PTRACE")
		file, err := run("noptrace", caps)
		if err != nil {
			t.Fatalf("sonde with %v: %v\n%s", caps, err, file)
		}
		if n := samplesIn(t, file, "sonde_cap_burn"); n != 0 {
			t.Errorf("%d samples name sonde_cap_burn without CAP_SYS_PTRACE: then the capability is not needed, and the test no longer shows why it is deployed", n)
		}
	})

	t.Run("without BPF", func(t *testing.T) {
		caps := without(wantCaps, "BPF")
		msg, err := run("nobpf", caps)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("sonde without CAP_BPF: %v, want a non-zero exit\n%s", err, msg)
		}
		if !strings.Contains(msg, "missing CAP_BPF") {
			t.Errorf("the message does not name CAP_BPF:\n%s", msg)
		}
	})

	// Uprobes take CAP_SYS_ADMIN, which the deployed set leaves out: asking for goroutines'
	// waits says so at once rather than failing on each Go program.
	t.Run("goroutine waits", func(t *testing.T) {
		file := filepath.Join(out, "goroutines.pb.gz")
		b, err := sondeWith(setpriv, sonde, wantCaps, "--off-cpu", "--off-cpu-goroutines", "--duration", "1s", "--top", "0", "--output", file).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("sonde --off-cpu-goroutines with %v: %v, want a non-zero exit\n%s", wantCaps, err, b)
		}
		if !strings.Contains(string(b), "--off-cpu-goroutines needs CAP_SYS_ADMIN") {
			t.Errorf("the message does not say what the flag needs:\n%s", b)
		}
	})

	t.Run("without PERFMON", func(t *testing.T) {
		caps := without(wantCaps, "PERFMON")
		msg, err := run("noperfmon", caps)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("sonde without CAP_PERFMON: %v, want a non-zero exit\n%s", err, msg)
		}
		if !strings.Contains(msg, "missing CAP_PERFMON") {
			t.Errorf("the message does not name CAP_PERFMON:\n%s", msg)
		}
	})
}

// namespaceDirs makes, under work, the empty directory a workload's namespace mounts its
// tmpfs over (mnt) and one every user may write the profiles to (out), and opens the
// path to them to every user.
func namespaceDirs(t *testing.T, work string) (mnt, out string) {
	t.Helper()
	mnt, out = filepath.Join(work, "mnt"), filepath.Join(work, "out")
	for _, d := range []string{mnt, out} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{filepath.Dir(work), work} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(out, 0o1777); err != nil {
		t.Fatal(err)
	}
	return mnt, out
}

// sondeWith runs sonde as uid 65534 with only the capabilities caps.
func sondeWith(setpriv, sonde string, caps []string, args ...string) *exec.Cmd {
	set := "-all"
	for _, c := range caps {
		set += ",+" + strings.ToLower(c)
	}
	return exec.Command(setpriv, append([]string{"--reuid", strconv.Itoa(sondeUID), "--regid", strconv.Itoa(sondeUID), "--clear-groups",
		"--no-new-privs", "--inh-caps=" + set, "--ambient-caps=" + set, "--bounding-set=" + set, sonde}, args...)...)
}

func runsAs(pid, uid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			return f[1] == strconv.Itoa(uid)
		}
	}
	return false
}

func without(caps []string, drop string) []string {
	var out []string
	for _, c := range caps {
		if c != drop {
			out = append(out, c)
		}
	}
	return out
}

// samplesIn counts the samples whose stack names fn; all of them for "".
func samplesIn(t *testing.T, file, fn string) int64 {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var n int64
	for _, s := range p.Sample {
		if fn == "" {
			n += s.Value[0]
			continue
		}
	stack:
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				if l.Function != nil && l.Function.Name == fn {
					n += s.Value[0]
					break stack
				}
			}
		}
	}
	return n
}

// TestCapabilitiesJava runs the built sonde as TestCapabilities does, against a JVM of
// another user in its own mount namespace, whose JDK and classes sit where only that user
// may search: the JVM's Java frames are walked and named from its memory, through
// /proc/PID, with the deployed capability set and nothing else (no attach, no agent).
func TestCapabilitiesJava(t *testing.T) {
	testenv.RequireRoot(t)
	setpriv := testenv.RequireTool(t, "setpriv")
	unshare := testenv.RequireTool(t, "unshare")
	const jdk = "/usr/lib/jvm/java-17-openjdk-amd64"
	if _, err := os.Stat(jdk + "/bin/javac"); err != nil {
		testenv.Unavailable(t, "needs JDK 17 at %s", jdk)
	}
	work := t.TempDir()
	classes := filepath.Join(work, "classes")
	if out, err := exec.Command(jdk+"/bin/javac", "-g", "-d", classes, "testdata/CapBurn.java").CombinedOutput(); err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}
	mnt, out := namespaceDirs(t, work)
	// The JDK is bound inside the private directory: its libjvm.so's path in the JVM's
	// maps exists in the JVM's namespace only.
	script := strings.Join([]string{
		"set -e",
		"mount -t tmpfs -o mode=755 none " + mnt,
		"mkdir -p " + mnt + "/private/jdk " + mnt + "/private/tmp",
		"mount --bind " + jdk + " " + mnt + "/private/jdk",
		"cp -r " + classes + " " + mnt + "/private/classes",
		"chown " + strconv.Itoa(workloadUID) + ":" + strconv.Itoa(workloadUID) + " " + mnt + "/private " + mnt + "/private/tmp",
		"chmod 700 " + mnt + "/private",
		"exec " + setpriv + " --reuid " + strconv.Itoa(workloadUID) + " --regid " + strconv.Itoa(workloadUID) + " --clear-groups " +
			mnt + "/private/jdk/bin/java -Djava.io.tmpdir=" + mnt + "/private/tmp -XX:-UsePerfData -cp " + mnt + "/private/classes CapBurn",
	}, "\n")
	// Past the JVM's start-up: its code cache is set up and capBurnLeaf compiled.
	profileDeployed(t, unshare, script, mnt+"/private/jdk", filepath.Join(out, "java.pb.gz"), "CapBurn.capBurnLeaf")
}

// TestCapabilitiesNode: a Node.js program of another user, in a mount namespace of its own
// where its executable and script are private, profiled by sonde as uid 65534 with the
// deployed capabilities only: its JavaScript functions named.
func TestCapabilitiesNode(t *testing.T) {
	testenv.RequireRoot(t)
	setpriv := testenv.RequireTool(t, "setpriv")
	unshare := testenv.RequireTool(t, "unshare")
	node := testenv.Node22(t)
	work := t.TempDir()
	mnt, out := namespaceDirs(t, work)
	script := strings.Join([]string{
		"set -e",
		"mount -t tmpfs -o mode=755 none " + mnt,
		"mkdir -p " + mnt + "/private",
		"touch " + mnt + "/private/node",
		"mount --bind " + node.Path + " " + mnt + "/private/node",
		"cp testdata/capburn.js " + mnt + "/private/capburn.js",
		"chown " + strconv.Itoa(workloadUID) + ":" + strconv.Itoa(workloadUID) + " " + mnt + "/private",
		"chmod 700 " + mnt + "/private",
		"exec " + setpriv + " --reuid " + strconv.Itoa(workloadUID) + " --regid " + strconv.Itoa(workloadUID) + " --clear-groups " +
			mnt + "/private/node " + mnt + "/private/capburn.js",
	}, "\n")
	profileDeployed(t, unshare, script, mnt+"/private/capburn.js", filepath.Join(out, "node.pb.gz"), "capBurnLeaf")
}

// startPrivate runs script (which ends in exec'ing a busy program as workloadUID) in a
// mount namespace of its own, where private exists and nowhere else, and returns once the
// program runs as its user; the test's end kills it.
func startPrivate(t *testing.T, unshare, script, private string) *exec.Cmd {
	t.Helper()
	wl := exec.Command(unshare, "--mount", "--propagation", "private", "sh", "-c", script)
	wl.Stderr = os.Stderr
	if err := wl.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		wl.Process.Kill()
		wl.Wait()
	})
	testenv.WaitFor(t, "the workload to run as its user", time.Minute, func() (bool, string) {
		return runsAs(wl.Process.Pid, workloadUID), ""
	})
	if _, err := os.Stat(private); err == nil {
		t.Fatalf("%s is visible outside the workload's mount namespace: the test would prove nothing", private)
	}
	return wl
}

// profileDeployed starts script as startPrivate does, waits until the program has used a
// second of CPU (past its start-up), profiles it
// for 4 s with sonde as uid 65534 with the deployed capabilities into out, and checks
// that fn names at least 80 % of the samples.
func profileDeployed(t *testing.T, unshare, script, private, out, fn string) {
	t.Helper()
	sonde := requireBinary(t)
	setpriv := testenv.RequireTool(t, "setpriv")
	wl := startPrivate(t, unshare, script, private)
	testenv.WaitCPU(t, wl.Process.Pid, time.Second)
	cmd := sondeWith(setpriv, sonde, wantCaps, "--pid", strconv.Itoa(wl.Process.Pid), "--duration", "4s", "--top", "0", "--output", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sonde with %v: %v\n%s", wantCaps, err, b)
	}
	total := samplesIn(t, out, "")
	named := samplesIn(t, out, fn)
	t.Logf("%d of %d samples name %s", named, total, fn)
	if named == 0 || float64(named) < 0.8*float64(total) {
		t.Errorf("%d of %d samples name %s, want 0.8", named, total, fn)
	}
}
