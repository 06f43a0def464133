package e2e

// End-to-end tests of the sonde binary itself: it profiles a C workload with BPF and
// exports to a real collector, which may be missing at first or die under it.

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// chainC spins in gamma, called through main -> alpha -> beta -> gamma, for
// argv[1] seconds. -fno-builtin keeps gcc from taking gamma for libm's.
const chainC = `#include <stdlib.h>
#include <time.h>
#define KEEP __attribute__((noinline))
static volatile unsigned long acc;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
KEEP void gamma(void){for(int i=0;i<1000000;i++) acc=acc*31+i;}
KEEP void beta(void){gamma(); acc^=2;}
KEEP void alpha(void){beta(); acc^=1;}
int main(int argc,char**argv){double end=now()+atof(argv[1]); while(now()<end) alpha(); return 0;}
`

// The chain the workload spends its time in, leaf first.
var wantChain = []string{"gamma", "beta", "alpha", "main"}

// Consecutive profiles must abut exactly and every timestamp must lie inside its
// profile: sonde keeps interval bounds on the wall clock only, moves a sample read
// just after a flush to the start of the interval it is counted in, and stretches an
// interval to hold the samples counted while its flush waited for /proc.
const (
	clockSkewTolerance = 0
	lateReadTolerance  = 0
)

// sondeFrequency is sonde's default rate with --pid; the tests pass it explicitly.
const sondeFrequency = 199

// Log messages of reporter/otlp/exporter.go.
const (
	msgOutageStart = `msg="otlp: cannot deliver profiles, queueing them and retrying"`
	msgOutageEnd   = `msg="otlp: collector reachable again"`
)

var (
	sondeOnce sync.Once
	sondePath string
	sondeErr  error
)

// sondeBinary builds cmd/agent once per test binary. It builds in sonde's own
// module, whose go.sum covers the agent's dependencies. SONDE_E2E_BINARY names a
// sonde to test instead, such as a release build.
func sondeBinary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("SONDE_E2E_BINARY"); bin != "" {
		return bin
	}
	sondeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sonde-e2e-agent-")
		if err != nil {
			sondeErr = err
			return
		}
		sondePath = filepath.Join(dir, "sonde")
		cmd := exec.Command("go", "build", "-o", sondePath, "./cmd/agent")
		cmd.Dir = filepath.Join(moduleDir(), "..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			sondeErr = fmt.Errorf("go build ./cmd/agent: %v\n%s", err, out)
		}
	})
	if sondeErr != nil {
		t.Fatal(sondeErr)
	}
	return sondePath
}

// TestMain removes the agent built for the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if sondePath != "" {
		os.RemoveAll(filepath.Dir(sondePath))
	}
	os.Exit(code)
}

// buildChain compiles chainC with frame pointers and a GNU build ID.
func buildChain(t testing.TB) string {
	t.Helper()
	gcc := testenv.RequireTool(t, "gcc")
	dir := t.TempDir()
	src := filepath.Join(dir, "chain.c")
	if err := os.WriteFile(src, []byte(chainC), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "chain")
	out, err := exec.Command(gcc, "-O0", "-g", "-fno-omit-frame-pointer", "-fno-builtin", "-Wl,--build-id",
		"-o", bin, src).CombinedOutput()
	if err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
}

// readelfBuildID returns the GNU build ID of bin as readelf -n prints it.
func readelfBuildID(t testing.TB, bin string) string {
	t.Helper()
	readelf := testenv.RequireTool(t, "readelf")
	out, err := exec.Command(readelf, "-n", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("readelf -n %s: %v\n%s", bin, err, out)
	}
	m := regexp.MustCompile(`Build ID:\s*([0-9a-f]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("readelf -n %s shows no build ID:\n%s", bin, out)
	}
	return string(m[1])
}

// startWorkload runs bin for secs seconds, killed when t ends.
func startWorkload(t testing.TB, bin string, secs int) int {
	t.Helper()
	cmd := exec.Command(bin, strconv.Itoa(secs))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// Let it get past the loader, so that its maps are those it keeps.
	testenv.WaitCPU(t, cmd.Process.Pid, 50*time.Millisecond)
	return cmd.Process.Pid
}

// syncBuffer is a bytes.Buffer a process writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// sondeProc is a running sonde.
type sondeProc struct {
	cmd     *exec.Cmd
	started time.Time
	stderr  syncBuffer
	stdout  syncBuffer
	done    chan struct{}
	waitErr error
}

// startSonde runs sonde with args, its environment stripped of OTEL_* variables
// and given env instead. The process is killed when t ends if it still runs.
func startSonde(t testing.TB, env []string, args ...string) *sondeProc {
	t.Helper()
	bin := sondeBinary(t)
	s := &sondeProc{done: make(chan struct{})}
	s.cmd = exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			s.cmd.Env = append(s.cmd.Env, kv)
		}
	}
	s.cmd.Env = append(s.cmd.Env, env...)
	s.cmd.Stdout, s.cmd.Stderr = &s.stdout, &s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start sonde: %v", err)
	}
	s.started = time.Now()
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			s.cmd.Process.Kill()
			<-s.done
		}
		if t.Failed() {
			t.Logf("sonde %v stderr:\n%s", args, lastLines(s.stderr.String(), 60))
		}
	})
	return s
}

// wait waits for sonde to exit by itself and returns its exit code; past timeout
// it fails t.
func (s *sondeProc) wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(timeout):
		t.Fatalf("sonde still runs %v after it started (stderr:\n%s)", time.Since(s.started).Round(time.Millisecond),
			lastLines(s.stderr.String(), 30))
	}
	return s.cmd.ProcessState.ExitCode()
}

// countLines counts the stderr lines that contain substr.
func (s *sondeProc) countLines(substr string) int {
	n := 0
	for _, l := range strings.Split(s.stderr.String(), "\n") {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

// summary returns the numeric fields of sonde's summary log line.
func (s *sondeProc) summary(t testing.TB) map[string]int64 {
	t.Helper()
	var line string
	sc := bufio.NewScanner(strings.NewReader(s.stderr.String()))
	for sc.Scan() {
		if strings.Contains(sc.Text(), " msg=summary ") {
			line = sc.Text()
		}
	}
	if line == "" {
		t.Fatalf("sonde logged no summary:\n%s", lastLines(s.stderr.String(), 30))
	}
	// Each stage logs a group of its own: otlp.sent_samples=… is read as otlp_sent_samples.
	out := map[string]int64{}
	for _, m := range regexp.MustCompile(`([\w.]+)=(-?\d+)(?:\s|$)`).FindAllStringSubmatch(line, -1) {
		v, _ := strconv.ParseInt(m[2], 10, 64)
		out[strings.ReplaceAll(m[1], ".", "_")] = v
	}
	for _, k := range []string{"kernel_samples", "otlp_sent_requests", "otlp_sent_samples", "otlp_dropped_intervals", "otlp_failed_attempts"} {
		if _, ok := out[k]; !ok {
			t.Fatalf("summary has no %s: %s", k, line)
		}
	}
	return out
}

// received is one profile the collector wrote, with what it refers to.
type received struct {
	profile  *profilespb.Profile
	dict     *profilespb.ProfilesDictionary
	resource map[string]any
	scope    string // name/version
}

func (r received) str(i int32) string { return r.dict.StringTable[i] }

// samples is the profile's sample count: timestamps, or values where there are none.
func (r received) samples() int64 {
	var n int64
	for _, s := range r.profile.Samples {
		n += sampleWeight(s)
	}
	return n
}

func sampleWeight(s *profilespb.Sample) int64 {
	if len(s.Values) == 0 {
		return int64(len(s.TimestampsUnixNano))
	}
	var n int64
	for _, v := range s.Values {
		n += v
	}
	return n
}

// attrs resolves attribute indices to key -> value.
func (r received) attrs(idx []int32) map[string]any {
	out := map[string]any{}
	for _, i := range idx {
		a := r.dict.AttributeTable[i]
		out[r.str(a.KeyStrindex)] = value(r.dict, a.Value)
	}
	return out
}

// frames returns a sample's function names leaf first (inlined frames included),
// and its locations.
func (r received) frames(s *profilespb.Sample) ([]string, []*profilespb.Location) {
	var names []string
	var locs []*profilespb.Location
	for _, li := range r.dict.StackTable[s.StackIndex].LocationIndices {
		l := r.dict.LocationTable[li]
		locs = append(locs, l)
		for _, ln := range l.Lines {
			names = append(names, r.str(r.dict.FunctionTable[ln.FunctionIndex].NameStrindex))
		}
	}
	return names, locs
}

// flatten lists every profile in msgs, oldest first.
func flatten(msgs []*profilespb.ProfilesData) []received {
	var out []received
	for _, pd := range msgs {
		for _, rp := range pd.ResourceProfiles {
			res := map[string]any{}
			for _, kv := range rp.Resource.GetAttributes() {
				key := kv.Key
				if kv.KeyStrindex != 0 {
					key = pd.Dictionary.StringTable[kv.KeyStrindex]
				}
				res[key] = value(pd.Dictionary, kv.Value)
			}
			for _, sp := range rp.ScopeProfiles {
				for _, p := range sp.Profiles {
					out = append(out, received{profile: p, dict: pd.Dictionary, resource: res,
						scope: sp.Scope.GetName() + "/" + sp.Scope.GetVersion()})
				}
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].profile.TimeUnixNano < out[j].profile.TimeUnixNano })
	return out
}

// checkOnce fails t if a profile arrived more than once: sonde encodes each
// interval once, with random profile IDs, so a resent request repeats them.
func checkOnce(t testing.TB, profiles []received) {
	t.Helper()
	seen := map[string]int{}
	for i, p := range profiles {
		id := fmt.Sprintf("%x", p.profile.ProfileId)
		if j, dup := seen[id]; dup {
			t.Errorf("profile %s [%d +%v] arrived twice (profiles %d and %d) with %d samples",
				id, p.profile.TimeUnixNano, time.Duration(p.profile.DurationNano), j, i, p.samples())
			continue
		}
		seen[id] = i
	}
}

// containsInOrder reports whether want appears in names in order, leaf first.
func containsInOrder(names, want []string) bool {
	i := 0
	for _, n := range names {
		if i < len(want) && n == want[i] {
			i++
		}
	}
	return i == len(want)
}

func totalSamples(ps []received) int64 {
	var n int64
	for _, p := range ps {
		n += p.samples()
	}
	return n
}

// waitDelivered waits until the collector has written at least n samples.
func waitDelivered(t testing.TB, c *Collector, n int64) {
	t.Helper()
	c.WaitFor(t, 20*time.Second, func(m []*profilespb.ProfilesData) bool { return Summarize(m).Samples >= n })
}

func TestSondeExportsToCollector(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildChain(t)
	buildID := readelfBuildID(t, bin)
	// sonde reports paths as /proc/PID/exe and /proc/PID/maps resolve them.
	if real, err := filepath.EvalSymlinks(bin); err == nil {
		bin = real
	}
	sondeBinary(t)
	c := StartCollector(t)
	pid := startWorkload(t, bin, 30)

	const run = 6 * time.Second
	cpuBefore := onCPU(t, pid)
	s := startSonde(t, []string{"OTEL_SERVICE_NAME=sonde-e2e", "OTEL_RESOURCE_ATTRIBUTES=deployment.environment=ci"},
		"--pid", strconv.Itoa(pid), "--duration", run.String(), "--interval", "2s", "--frequency", strconv.Itoa(sondeFrequency),
		"--otlp-endpoint", c.Endpoint, "--otlp-insecure", "--timestamps", "--thread-attributes", "name,id", "--top", "0")
	code := s.wait(t, 40*time.Second)
	cpu := onCPU(t, pid) - cpuBefore
	if code != 0 {
		t.Fatalf("sonde exit status %d", code)
	}
	sum := s.summary(t)
	waitDelivered(t, c, sum["otlp_sent_samples"])
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Received()
	if err != nil {
		t.Fatal(err)
	}
	profiles := flatten(msgs)
	if len(profiles) == 0 || totalSamples(profiles) == 0 {
		t.Fatalf("collector got no samples")
	}

	t.Run("summary", func(t *testing.T) {
		if sum["otlp_sent_samples"] == 0 || sum["otlp_dropped_intervals"] != 0 || sum["otlp_failed_attempts"] != 0 {
			t.Errorf("summary: sent %d samples, dropped %d intervals, %d failed attempts; want some sent, nothing dropped or failed",
				sum["otlp_sent_samples"], sum["otlp_dropped_intervals"], sum["otlp_failed_attempts"])
		}
		if total := totalSamples(profiles); total != sum["otlp_sent_samples"] {
			t.Errorf("collector wrote %d samples, sonde says it sent %d", total, sum["otlp_sent_samples"])
		}
		checkOnce(t, profiles)
		checkSampleCount(t, totalSamples(profiles), cpu, run)
	})

	// Every profile is the workload's: --pid filters in the kernel. The agent's own
	// OTEL_SERVICE_NAME names sonde; the process is named by its executable.
	t.Run("resource", func(t *testing.T) {
		hostName, _ := os.Hostname()
		machineID, _ := os.ReadFile("/etc/machine-id")
		want := map[string]any{
			"process.pid":             int64(pid),
			"process.executable.name": "chain",
			"process.executable.path": bin,
			"host.name":               hostName,
			"os.type":                 "linux",
			"service.name":            "chain",
			"deployment.environment":  "ci",
		}
		if id := strings.TrimSpace(string(machineID)); id != "" {
			want["host.id"] = id
		}
		for i, p := range profiles {
			for k, v := range want {
				if got, ok := p.resource[k]; !ok || got != v {
					t.Errorf("profile %d: resource %s = %v (present %v), want %v", i, k, got, ok, v)
				}
			}
			if name, _, _ := strings.Cut(p.scope, "/"); name != "sonde" {
				t.Errorf("profile %d: scope %q, want sonde", i, p.scope)
			}
		}
	})

	t.Run("types", func(t *testing.T) {
		for i, p := range profiles {
			pr := p.profile
			if st := pr.SampleType; st == nil || p.str(st.TypeStrindex) != "samples" || p.str(st.UnitStrindex) != "count" {
				t.Errorf("profile %d: sample type %v, want samples/count", i, st)
			}
			if pt := pr.PeriodType; pt == nil || p.str(pt.TypeStrindex) != "cpu" || p.str(pt.UnitStrindex) != "nanoseconds" {
				t.Errorf("profile %d: period type %v, want cpu/nanoseconds", i, pt)
			}
			if want := int64(time.Second / sondeFrequency); pr.Period != want {
				t.Errorf("profile %d: period %d, want %d", i, pr.Period, want)
			}
		}
	})

	t.Run("stacks", func(t *testing.T) {
		var total, chained int64
		threadOK, frameTypeOK := true, true
		buildIDs := map[string]bool{}
		checkedMapping := false
		for _, p := range profiles {
			for _, smp := range p.profile.Samples {
				w := sampleWeight(smp)
				total += w
				attrs := p.attrs(smp.AttributeIndices)
				if (attrs["thread.name"] != "chain" || attrs["thread.id"] != int64(pid)) && threadOK {
					threadOK = false
					t.Logf("a sample's attributes: %v", attrs)
				}
				names, locs := p.frames(smp)
				if containsInOrder(names, wantChain) {
					chained += w
				}
				for _, l := range locs {
					kind, ok := p.attrs(l.AttributeIndices)["profile.frame.type"]
					if !ok {
						frameTypeOK = false
					}
					if len(l.Lines) == 0 || l.MappingIndex == 0 {
						continue
					}
					fn := p.str(p.dict.FunctionTable[l.Lines[0].FunctionIndex].NameStrindex)
					if !slices.Contains(wantChain, fn) {
						continue
					}
					if kind != "native" {
						t.Errorf("%s's location has profile.frame.type %v, want native", fn, kind)
					}
					m := p.dict.MappingTable[l.MappingIndex]
					if file := p.str(m.FilenameStrindex); file != bin {
						t.Errorf("%s's mapping is %q, want %s", fn, file, bin)
					}
					id, _ := p.attrs(m.AttributeIndices)["process.executable.build_id.gnu"].(string)
					buildIDs[id] = true
					checkedMapping = true
				}
			}
		}
		if !threadOK {
			t.Errorf("samples lack thread.name=chain or thread.id=%d", pid)
		}
		if !frameTypeOK {
			t.Error("locations without profile.frame.type")
		}
		if !checkedMapping {
			t.Error("no location of gamma, beta, alpha or main has a mapping")
		} else if len(buildIDs) != 1 || !buildIDs[buildID] {
			t.Errorf("workload mapping build ids %v, want only %s (readelf -n)", buildIDs, buildID)
		}
		if share := float64(chained) / float64(total); share < 0.9 {
			t.Errorf("gamma<-beta<-alpha<-main in %.3f of %d samples, want at least 0.90", share, total)
		}
	})

	// Intervals: several, each with a length, one after another, covering the run, and
	// every timestamp inside its own.
	t.Run("intervals", func(t *testing.T) {
		if len(profiles) < 2 {
			t.Errorf("%d profiles in a %v run at --interval 2s, want at least 2", len(profiles), run)
		}
		var covered time.Duration
		var outside []string
		var worstOutside time.Duration
		for i, p := range profiles {
			pr := p.profile
			if pr.DurationNano == 0 {
				t.Errorf("profile %d: duration_nano 0", i)
			}
			covered += time.Duration(pr.DurationNano)
			if i > 0 {
				prev := profiles[i-1].profile
				if prevEnd := prev.TimeUnixNano + prev.DurationNano; pr.TimeUnixNano < prevEnd {
					if overlap := time.Duration(prevEnd - pr.TimeUnixNano); overlap > clockSkewTolerance {
						t.Errorf("profile %d starts %v before profile %d ends", i, overlap, i-1)
					}
				}
			}
			start, end := pr.TimeUnixNano, pr.TimeUnixNano+pr.DurationNano
			for _, smp := range pr.Samples {
				if len(smp.TimestampsUnixNano) == 0 {
					t.Errorf("profile %d: a sample without timestamps under --timestamps: values %v", i, smp.Values)
				}
				for _, ts := range smp.TimestampsUnixNano {
					if ts >= start && ts < end {
						continue
					}
					off := time.Duration(ts - end)
					if ts < start {
						off = -time.Duration(start - ts)
					}
					outside = append(outside, fmt.Sprintf("profile %d [%d, %d): %d (%v beyond)", i, start, end, ts, off))
					worstOutside = max(worstOutside, off.Abs())
				}
			}
		}
		if covered < run*7/10 || covered > run*13/10 {
			t.Errorf("profiles cover %v of a %v run, want within 30%%", covered, run)
		}
		if len(outside) > 0 && worstOutside > lateReadTolerance {
			t.Errorf("%d timestamps lie outside their profile's [time, time+duration):\n%s",
				len(outside), strings.Join(outside[:min(len(outside), 10)], "\n"))
		}
	})
	size := 0
	for _, m := range msgs {
		size += proto.Size(m)
	}
	t.Logf("%d profiles, %d samples for %v of workload CPU, %d bytes in %d messages",
		len(profiles), totalSamples(profiles), cpu.Round(time.Millisecond), size, len(msgs))
}

// A collector that is down when sonde starts gets the queued intervals once it is
// up, and the outage is reported once, not at every retry.
func TestSondeRidesOutCollectorOutage(t *testing.T) {
	testenv.RequireRoot(t)
	// The outage tests wait out collectors' absences, each with its own collector, sonde
	// and workload: they wait at once.
	t.Parallel()
	bin := buildChain(t)
	sondeBinary(t)
	CollectorBinary(t) // build it now, not while sonde waits for it
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf("127.0.0.1:%d", port)
	pid := startWorkload(t, bin, 30)

	const run = 10 * time.Second
	cpuBefore := onCPU(t, pid)
	s := startSonde(t, nil, "--pid", strconv.Itoa(pid), "--duration", run.String(), "--interval", "1s",
		"--frequency", strconv.Itoa(sondeFrequency), "--otlp-endpoint", endpoint, "--otlp-insecure", "--top", "0")
	time.Sleep(3 * time.Second)
	select {
	case <-s.done:
		t.Fatalf("sonde exited while the collector was down: %v", s.waitErr)
	default:
	}
	if n := s.countLines(msgOutageStart); n != 1 {
		t.Errorf("3 s into a run at --interval 1s with no collector, %d lines announce the outage, want 1", n)
	}
	upAt := time.Now()
	c := StartCollectorOn(t, port)
	t.Logf("collector up %v after sonde started", upAt.Sub(s.started).Round(time.Millisecond))

	code := s.wait(t, 40*time.Second)
	cpu := onCPU(t, pid) - cpuBefore
	if code != 0 {
		t.Fatalf("sonde exit status %d", code)
	}
	sum := s.summary(t)
	if sum["otlp_sent_samples"] == 0 {
		t.Fatalf("sonde sent nothing once the collector was up")
	}
	if sum["otlp_failed_attempts"] == 0 {
		t.Errorf("no failed attempts while the collector was down")
	}
	if sum["otlp_dropped_intervals"] != 0 {
		t.Errorf("%d intervals dropped; the default queue holds the whole outage", sum["otlp_dropped_intervals"])
	}
	waitDelivered(t, c, sum["otlp_sent_samples"])
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Received()
	if err != nil {
		t.Fatal(err)
	}
	profiles := flatten(msgs)
	checkOnce(t, profiles)
	total := totalSamples(profiles)
	if total != sum["otlp_sent_samples"] {
		t.Errorf("collector wrote %d samples, sonde says it sent %d", total, sum["otlp_sent_samples"])
	}
	checkSampleCount(t, total, cpu, run)
	// The intervals queued during the outage arrived too.
	if len(profiles) == 0 || time.Unix(0, int64(profiles[0].profile.TimeUnixNano)).After(upAt.Add(-time.Second)) {
		t.Errorf("no profile of the time the collector was down arrived")
	}
	for i, p := range profiles {
		if p.resource["process.pid"] != int64(pid) {
			t.Errorf("profile %d is of pid %v, want %d", i, p.resource["process.pid"], pid)
		}
	}

	if n := s.countLines(msgOutageStart); n != 1 {
		t.Errorf("%d lines announce the outage, want 1:\n%s", n, s.stderr.String())
	}
	if n := s.countLines(msgOutageEnd); n != 1 {
		t.Errorf("%d lines announce the end of the outage, want 1", n)
	}
	t.Logf("%d profiles, %d samples for %v of workload CPU; summary %v", len(profiles), total, cpu.Round(time.Millisecond), sum)
}

// onCPU returns how long pid has run on a CPU: /proc/PID/schedstat to the
// nanosecond, or /proc/PID/stat's utime and stime in USER_HZ (100 Hz) ticks.
func onCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid)); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				return time.Duration(ns)
			}
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("CPU time of %d: %v", pid, err)
	}
	// Fields after the command name, which may hold spaces: utime and stime are the
	// 12th and 13th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		t.Fatalf("CPU time of %d: short stat %q", pid, b)
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// checkSampleCount checks that sonde took about one sample per period of the
// workload's CPU time: the workload is one busy thread, but on two shared cores it
// may not get a whole one. The nominal count, frequency times run, must be met
// within 60% when the workload had most of a core.
func checkSampleCount(t testing.TB, got int64, cpu, run time.Duration) {
	t.Helper()
	expected := float64(sondeFrequency) * cpu.Seconds()
	if ratio := float64(got) / expected; ratio < 0.8 || ratio > 1.15 {
		t.Errorf("%d samples for %v of the workload's CPU time at %d Hz: %.2f of the %.0f expected, want 0.8 to 1.15",
			got, cpu.Round(time.Millisecond), sondeFrequency, ratio, expected)
	}
	nominal := int64(sondeFrequency * run.Seconds())
	if got < nominal*6/10 {
		if cpu < run*7/10 {
			t.Logf("%d samples, under 60%% of %d, but the workload ran only %v of %v: the cores are busy elsewhere",
				got, nominal, cpu.Round(time.Millisecond), run)
		} else {
			t.Errorf("%d samples of a busy thread in %v at %d Hz, want at least 60%% of %d", got, run, sondeFrequency, nominal)
		}
	}
}

// rssKiB reads VmRSS of pid.
func rssKiB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	m := regexp.MustCompile(`(?m)^VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return strconv.ParseInt(string(m[1]), 10, 64)
}

// A collector that dies under sonde costs queued intervals, the oldest first, but
// neither sonde's life nor unbounded memory.
func TestSondeSurvivesCollectorKilled(t *testing.T) {
	testenv.RequireRoot(t)
	// The outage tests wait out collectors' absences, each with its own collector, sonde
	// and workload: they wait at once.
	t.Parallel()
	bin := buildChain(t)
	sondeBinary(t)
	c := StartCollector(t)
	pid := startWorkload(t, bin, 40)

	const (
		run    = 12 * time.Second
		killAt = 4 * time.Second
		queue  = 3
	)
	s := startSonde(t, nil, "--pid", strconv.Itoa(pid), "--duration", run.String(), "--interval", "1s",
		"--frequency", strconv.Itoa(sondeFrequency), "--otlp-endpoint", c.Endpoint, "--otlp-insecure",
		"--otlp-queue", strconv.Itoa(queue), "--top", "0",
		// The first sample with a kernel stack (a timer interrupt now and then) makes
		// sonde read /proc/kallsyms, a one-time step of about 30 MiB of RSS at a random
		// time that would mask what this test watches: the exporter's memory.
		"--kernel-stacks=false")
	time.Sleep(killAt - time.Since(s.started))
	waitDelivered(t, c, 1)
	c.Kill()
	killed := time.Now()

	// RSS while the collector is down, every 500 ms until sonde exits.
	type reading struct {
		at  time.Duration // since the kill
		kib int64
	}
	var rss []reading
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	// Stop sampling as sampling stops: after --duration sonde drains and exits.
	stopAt := s.started.Add(run)
sampling:
	for time.Now().Before(stopAt) {
		select {
		case <-s.done:
			break sampling
		case <-tick.C:
		}
		kib, err := rssKiB(s.cmd.Process.Pid)
		if err != nil {
			break
		}
		rss = append(rss, reading{time.Since(killed), kib})
	}
	if code := s.wait(t, 40*time.Second); code != 0 {
		t.Fatalf("sonde exit status %d after the collector was killed", code)
	}
	sum := s.summary(t)
	if sum["otlp_sent_samples"] == 0 {
		t.Errorf("nothing sent before the collector was killed")
	}
	if sum["otlp_dropped_intervals"] == 0 {
		t.Errorf("no intervals dropped with --otlp-queue %d and a %v outage", queue, run-killAt)
	}
	// Those still queued at exit are dropped too; the rest went from the full queue.
	atExit := int64(0)
	if m := regexp.MustCompile(`otlp: (\d+) intervals undelivered at shutdown`).FindStringSubmatch(s.stderr.String()); m != nil {
		atExit, _ = strconv.ParseInt(m[1], 10, 64)
	} else {
		t.Errorf("sonde did not say what it could not deliver at exit")
	}
	if atExit > queue+1 {
		t.Errorf("%d intervals queued at exit with --otlp-queue %d", atExit, queue)
	}
	if overflow := sum["otlp_dropped_intervals"] - atExit; overflow < 2 {
		t.Errorf("%d intervals dropped from the full queue during a %v outage at --interval 1s with --otlp-queue %d, want at least 2",
			overflow, run-killAt, queue)
	}
	if n := s.countLines(msgOutageStart); n != 1 {
		t.Errorf("%d lines announce the outage, want 1", n)
	}

	// Memory stays flat though intervals keep coming and going nowhere.
	var base int64
	var peak reading
	var series []string
	for _, r := range rss {
		series = append(series, fmt.Sprintf("%.1fs:%dMiB", r.at.Seconds(), r.kib>>10))
		if base == 0 && r.at >= time.Second {
			base = r.kib
		}
		if base != 0 && r.at >= (run-killAt)-4*time.Second && r.kib > peak.kib {
			peak = r
		}
	}
	t.Logf("RSS after the kill: %s", strings.Join(series, " "))
	if base == 0 || peak.kib == 0 {
		t.Fatalf("too few RSS readings during the outage: %s", strings.Join(series, " "))
	}
	// Sonde's RSS is flat within a MiB here once it has sent a few intervals; the
	// bound leaves room for a GC cycle's worth of garbage, and fails a leak of about
	// 2 MiB per interval over the last four seconds of the outage.
	if limit := base*5/4 + 10<<10; peak.kib > limit {
		t.Errorf("RSS grew from %d KiB 1 s into the outage to %d KiB at %v, over %d KiB", base, peak.kib, peak.at, limit)
	}
	t.Logf("summary %v; %d intervals queued at exit", sum, atExit)
}

// The collector away for a while (20 s here, ten minutes under SONDE_SOAK=1) then back:
// sonde's memory stays within --memory-limit, sampling never stops, the intervals the
// queue cannot hold are counted as dropped, and delivery resumes within an interval.
func TestSondeOutage(t *testing.T) {
	testenv.RequireRoot(t)
	// The outage tests wait out collectors' absences, each with its own collector, sonde
	// and workload: they wait at once.
	t.Parallel()
	bin := buildChain(t)
	sondeBinary(t)
	// Ten intervals: twice what the queue holds, so that some are dropped.
	outage := 20 * time.Second
	if os.Getenv("SONDE_SOAK") == "1" {
		outage = 10 * time.Minute
	}
	c := StartCollector(t)
	port := c.Port()
	pid := startWorkload(t, bin, int((outage + time.Minute).Seconds()))
	const (
		interval = 2 * time.Second
		limit    = 64 << 20
	)
	s := startSonde(t, nil, "--pid", strconv.Itoa(pid), "--interval", interval.String(),
		"--frequency", strconv.Itoa(sondeFrequency), "--otlp-endpoint", c.Endpoint, "--otlp-insecure",
		"--otlp-queue", "5", "--memory-limit", "64MiB", "--top", "0")
	waitDelivered(t, c, 1)
	c.Kill()
	down := time.Now()
	var peak int64
	for time.Since(down) < outage {
		time.Sleep(time.Second)
		kib, err := rssKiB(s.cmd.Process.Pid)
		if err != nil {
			t.Fatalf("sonde exited during the outage: %v\n%s", err, lastLines(s.stderr.String(), 20))
		}
		peak = max(peak, kib<<10)
	}
	before := time.Now()
	c2 := StartCollectorOn(t, port)
	// Delivery resumes within an interval of the collector's return, backoff included.
	deadline := before.Add(interval + 5*time.Second)
	for {
		msgs, _ := c2.Received()
		if len(msgs) > 0 {
			t.Logf("delivery resumed %v after the collector came back", time.Since(before).Round(100*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing delivered %v after the collector came back", time.Since(before).Round(time.Second))
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.cmd.Process.Signal(os.Interrupt)
	if code := s.wait(t, time.Minute); code != 0 {
		t.Fatalf("sonde exit status %d", code)
	}
	sum := s.summary(t)
	if peak > limit {
		t.Errorf("RSS reached %.1f MiB during the outage, over --memory-limit 64MiB", float64(peak)/(1<<20))
	}
	if sum["otlp_dropped_intervals"] == 0 {
		t.Errorf("no intervals dropped in a %v outage at --interval %v with --otlp-queue 5", outage, interval)
	}
	// Sampling never stopped: about one sample per period of the outage and the rest.
	if nominal := int64(float64(sondeFrequency) * outage.Seconds()); sum["kernel_samples"] < nominal/3 {
		t.Errorf("%d samples over a %v outage at %d Hz: sampling stopped", sum["kernel_samples"], outage, sondeFrequency)
	}
	t.Logf("peak RSS %.1f MiB; summary %v", float64(peak)/(1<<20), sum)
}
