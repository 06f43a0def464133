// Package e2e runs sonde against a real OpenTelemetry Collector.
//
// It is a module of its own so that the collector's many dependencies stay out of
// sonde's. StartCollector builds cmd/otelcol-sonde (an OTLP receiver, and file and
// debug exporters in a profiles pipeline) once per dependency set, starts it on a
// free loopback port, and reads back what its file exporter wrote.
//
// Run it from this directory: go test -timeout 30m ./... (the first build of the
// collector takes minutes; later runs reuse it from CacheDir). After a change to
// sonde's own dependencies, run go mod tidy -e here: plain tidy stops at a test-only
// dependency of the file exporter that the module proxy does not serve.
package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// CacheDir holds built collectors, one directory per hash of the sources and
// dependencies, so that only the first run pays for the build.
const CacheDir = "/tmp/sonde-e2e-otelcol"

// FeatureGates are the gates the collector needs: profiles are still alpha.
const FeatureGates = "service.profilesSupport"

// moduleDir is this module's root, where go.mod and cmd/otelcol-sonde are.
func moduleDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// CollectorBinary returns the path of the built collector, building it first if
// no build of the current sources is cached. A collector that cannot be built
// skips the test outside CI and fails it under CI=true.
func CollectorBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() { buildPath, buildErr = buildCollector() })
	if buildErr != nil {
		testenv.Unavailable(t, "cannot build the OpenTelemetry Collector: %v", buildErr)
	}
	return buildPath
}

func buildCollector() (string, error) {
	dir := moduleDir()
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum", "cmd/otelcol-sonde/main.go"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", fmt.Errorf("hash sources: %w", err)
		}
		h.Write(b)
	}
	// The go command that builds it is the one running the tests, near enough.
	h.Write([]byte(runtime.Version()))
	key := hex.EncodeToString(h.Sum(nil))[:16]
	out := filepath.Join(CacheDir, key, "otelcol-sonde")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("no go command: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", fmt.Errorf("create build cache: %w", err)
	}
	// Build beside the final path and rename, so that concurrent test binaries
	// never run a half-written collector.
	tmp := fmt.Sprintf("%s.%d.tmp", out, os.Getpid())
	args := []string{goBin, "build", "-o", tmp, "./cmd/otelcol-sonde"}
	// The build takes minutes on a small machine shared with others: be nice.
	if nice, err := exec.LookPath("nice"); err == nil {
		args = append([]string{nice, "-n", "10"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("go build ./cmd/otelcol-sonde: %w\n%s", err, lastLines(log.String(), 30))
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", fmt.Errorf("install collector: %w", err)
	}
	return out, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Collector is a running collector. Its profiles pipeline sends what the OTLP
// receiver gets to the file exporter (format proto) and the debug exporter.
type Collector struct {
	// Endpoint is the OTLP/gRPC receiver's address, "127.0.0.1:PORT", plaintext.
	Endpoint string
	// Output is the file exporter's file: 4-byte big-endian lengths, each followed
	// by a ProfilesData message of that length.
	Output string
	// TracesOutput is the traces pipeline's file, in the same framing, of TracesData.
	TracesOutput string
	// Log holds the collector's stdout and stderr, debug exporter output included.
	Log string
	// Config is the collector's configuration file.
	Config string
	// Files holds the paths of the further file exporters CollectorOptions.Files asked
	// for, by name.
	Files map[string]string

	opts CollectorOptions

	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	stop    sync.Once
	stopErr error
}

// CollectorOptions add to a collector's configuration.
type CollectorOptions struct {
	// Files are further file exporters in the profiles pipeline, by name: each writes
	// to a file of its own with the settings given, YAML lines beside path, such as
	// "format: proto\ncompression: zstd".
	Files map[string]string
	// FeatureGates are enabled beside FeatureGates, such as
	// "exporter.file.nativeCompression", which the collector applies to every file
	// exporter.
	FeatureGates []string
}

// configTemplate has a %s for the receiver's endpoint, then the profiles' output path,
// further exporters, the traces' output path, and the further exporters' names in the
// profiles pipeline.
const configTemplate = `receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
exporters:
  debug:
    verbosity: basic
  file:
    path: %s
    format: proto
    flush_interval: 100ms
%s  file/traces:
    path: %s
    format: proto
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    profiles:
      receivers: [otlp]
      exporters: [file, debug%s]
    traces:
      receivers: [otlp]
      exporters: [file/traces]
`

// StartCollector starts a collector for t, with its files in t.TempDir(), and
// stops it when t ends. It returns once the receiver accepts connections.
func StartCollector(t testing.TB) *Collector {
	t.Helper()
	return startCollector(t, 0, CollectorOptions{})
}

// StartCollectorWith is StartCollector with further file exporters and feature gates.
func StartCollectorWith(t testing.TB, opts CollectorOptions) *Collector {
	t.Helper()
	return startCollector(t, 0, opts)
}

// StartCollectorOn is StartCollector with the receiver on 127.0.0.1:port, for a
// collector that must appear where a client already sends, such as one that comes
// up after the client started or comes back after an outage. It fails t if the
// port is taken.
func StartCollectorOn(t testing.TB, port int) *Collector {
	t.Helper()
	if port <= 0 {
		t.Fatalf("StartCollectorOn: port %d", port)
	}
	return startCollector(t, port, CollectorOptions{})
}

// startCollector starts a collector on port, or on a free port when port is 0.
func startCollector(t testing.TB, port int, opts CollectorOptions) *Collector {
	t.Helper()
	bin := CollectorBinary(t)
	dir := t.TempDir()
	c := &Collector{
		Output:       filepath.Join(dir, "profiles.pb"),
		TracesOutput: filepath.Join(dir, "traces.pb"),
		Log:          filepath.Join(dir, "collector.log"),
		Config:       filepath.Join(dir, "config.yaml"),
		Files:        map[string]string{},
		opts:         opts,
	}
	for name := range opts.Files {
		c.Files[name] = filepath.Join(dir, "profiles-"+name)
	}
	// A free port may be taken between this probe and the collector's bind; then the
	// collector exits and the next try picks another. A given port gets one try.
	tries := 3
	if port != 0 {
		tries = 1
	}
	var lastErr error
	for range tries {
		p := port
		if p == 0 {
			var err error
			if p, err = FreePort(); err != nil {
				t.Fatalf("find a free port: %v", err)
			}
		}
		c.Endpoint = fmt.Sprintf("127.0.0.1:%d", p)
		if lastErr = c.start(bin); lastErr == nil {
			t.Cleanup(func() {
				if err := c.Stop(); err != nil {
					t.Errorf("stop collector: %v", err)
				}
				if t.Failed() {
					t.Logf("collector log (%s):\n%s", c.Log, lastLines(c.ReadLog(), 60))
				}
			})
			return c
		}
	}
	t.Fatalf("start collector: %v\nlog:\n%s", lastErr, lastLines(c.ReadLog(), 60))
	return nil
}

func (c *Collector) start(bin string) error {
	var extra, names strings.Builder
	for _, name := range slices.Sorted(maps.Keys(c.opts.Files)) {
		fmt.Fprintf(&extra, "  file/%s:\n    path: %s\n", name, c.Files[name])
		for _, line := range strings.Split(strings.TrimSpace(c.opts.Files[name]), "\n") {
			fmt.Fprintf(&extra, "    %s\n", line)
		}
		fmt.Fprintf(&names, ", file/%s", name)
	}
	cfg := fmt.Sprintf(configTemplate, c.Endpoint, c.Output, extra.String(), c.TracesOutput, names.String())
	if err := os.WriteFile(c.Config, []byte(cfg), 0o644); err != nil {
		return err
	}
	logf, err := os.Create(c.Log)
	if err != nil {
		return err
	}
	gates := strings.Join(append([]string{FeatureGates}, c.opts.FeatureGates...), ",")
	c.cmd = exec.Command(bin, "--config", "file:"+c.Config, "--feature-gates="+gates)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	if err := c.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("run %s: %w", bin, err)
	}
	c.exited = make(chan struct{})
	go func() {
		c.waitErr = c.cmd.Wait()
		logf.Close()
		close(c.exited)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-c.exited:
			return fmt.Errorf("collector exited at start: %v", c.waitErr)
		default:
		}
		conn, err := net.DialTimeout("tcp", c.Endpoint, 200*time.Millisecond)
		if err == nil {
			conn.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.cmd.Process.Kill()
	<-c.exited
	return errors.New("collector did not listen within 30s")
}

// FreePort returns a loopback TCP port that nothing listens on right now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Stop shuts the collector down gracefully, which flushes the file exporter, and
// kills it if it takes more than 15 seconds. Calling it again does nothing.
func (c *Collector) Stop() error {
	c.stop.Do(func() {
		select {
		case <-c.exited:
			c.stopErr = fmt.Errorf("collector had exited: %v", c.waitErr)
			return
		default:
		}
		c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.exited:
			if c.waitErr != nil {
				c.stopErr = fmt.Errorf("collector exit: %w", c.waitErr)
			}
		case <-time.After(15 * time.Second):
			c.cmd.Process.Kill()
			<-c.exited
			c.stopErr = errors.New("collector ignored SIGTERM for 15s; killed")
		}
	})
	return c.stopErr
}

// Kill ends the collector with SIGKILL, as a crash or an abrupt network loss
// would: nothing is flushed and open connections are reset. Stop after Kill, or
// Kill after Stop, does nothing.
func (c *Collector) Kill() {
	c.stop.Do(func() {
		select {
		case <-c.exited:
			c.stopErr = fmt.Errorf("collector had exited: %v", c.waitErr)
			return
		default:
		}
		c.cmd.Process.Kill()
		<-c.exited
	})
}

// ReadLog returns the collector's output so far.
func (c *Collector) ReadLog() string {
	b, _ := os.ReadFile(c.Log)
	return string(b)
}

// Received returns the messages the file exporter has written so far.
func (c *Collector) Received() ([]*profilespb.ProfilesData, error) {
	return ReadProfilesFile(c.Output)
}

// WaitFor polls what the collector received until done accepts it, and returns it.
// It fails t after timeout.
func (c *Collector) WaitFor(t testing.TB, timeout time.Duration, done func([]*profilespb.ProfilesData) bool) []*profilespb.ProfilesData {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		got, err := c.Received()
		if err != nil {
			t.Fatalf("read collector output: %v", err)
		}
		if done(got) {
			return got
		}
		select {
		case <-ctx.Done():
			t.Fatalf("collector did not receive the expected profiles within %v (got %d messages)\nlog:\n%s",
				timeout, len(got), lastLines(c.ReadLog(), 40))
		case <-c.exited:
			t.Fatalf("collector exited: %v\nlog:\n%s", c.waitErr, lastLines(c.ReadLog(), 40))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ReceivedTraces returns the traces the file exporter has written so far.
func (c *Collector) ReceivedTraces() ([]*tracepb.TracesData, error) {
	b, err := os.ReadFile(c.TracesOutput)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*tracepb.TracesData
	for len(b) >= 4 {
		n := binary.BigEndian.Uint32(b)
		if uint64(len(b)-4) < uint64(n) {
			break
		}
		td := &tracepb.TracesData{}
		if err := proto.Unmarshal(b[4:4+n], td); err != nil {
			return out, fmt.Errorf("traces message %d: %w", len(out), err)
		}
		out = append(out, td)
		b = b[4+n:]
	}
	return out, nil
}

// ReadProfilesFile decodes a file exporter's proto output. A missing file holds
// nothing yet; a record cut short at the end is one still being written, and is
// left for the next read.
func ReadProfilesFile(path string) ([]*profilespb.ProfilesData, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return DecodeProfilesStream(b)
}

// DecodeProfilesStream decodes length-prefixed ProfilesData messages, ignoring a
// truncated last one.
func DecodeProfilesStream(b []byte) ([]*profilespb.ProfilesData, error) {
	var out []*profilespb.ProfilesData
	for len(b) >= 4 {
		n := binary.BigEndian.Uint32(b)
		if uint64(len(b)-4) < uint64(n) {
			break
		}
		pd := &profilespb.ProfilesData{}
		if err := proto.Unmarshal(b[4:4+n], pd); err != nil {
			return out, fmt.Errorf("message %d: %w", len(out), err)
		}
		out = append(out, pd)
		b = b[4+n:]
	}
	return out, nil
}

// Summary is what a consumer sees in profiles, dictionary indices resolved.
type Summary struct {
	// Resources holds each resource's attributes, whether sent with plain keys (as
	// sonde does) or through the dictionary (as the collector writes them).
	Resources []map[string]any
	Functions map[string]bool
	// Mappings maps a mapping's file name to its attributes, "key=value", sorted.
	Mappings   map[string][]string
	FrameTypes map[string]bool // profile.frame.type values
	Threads    map[string]bool // thread.name values
	Samples    int64           // CPU samples: sums of values, or timestamp counts
	Profiles   int
	Scopes     []string // "name/version" of each scope
}

// Summarize resolves msgs into a Summary.
func Summarize(msgs []*profilespb.ProfilesData) Summary {
	v := Summary{Functions: map[string]bool{}, Mappings: map[string][]string{}, FrameTypes: map[string]bool{}, Threads: map[string]bool{}}
	for _, pd := range msgs {
		d := pd.Dictionary
		attrs := func(idx []int32) []string {
			var out []string
			for _, i := range idx {
				a := d.AttributeTable[i]
				out = append(out, fmt.Sprintf("%s=%v", d.StringTable[a.KeyStrindex], value(d, a.Value)))
			}
			sort.Strings(out)
			return out
		}
		for _, rp := range pd.ResourceProfiles {
			r := map[string]any{}
			for _, kv := range rp.Resource.GetAttributes() {
				key := kv.Key
				if kv.KeyStrindex != 0 {
					key = d.StringTable[kv.KeyStrindex]
				}
				r[key] = value(d, kv.Value)
			}
			v.Resources = append(v.Resources, r)
			for _, sp := range rp.ScopeProfiles {
				v.Scopes = append(v.Scopes, sp.Scope.GetName()+"/"+sp.Scope.GetVersion())
				for _, p := range sp.Profiles {
					v.Profiles++
					for _, s := range p.Samples {
						for _, a := range attrs(s.AttributeIndices) {
							if name, ok := strings.CutPrefix(a, "thread.name="); ok {
								v.Threads[name] = true
							}
						}
						if len(s.Values) == 0 {
							v.Samples += int64(len(s.TimestampsUnixNano))
						}
						for _, x := range s.Values {
							v.Samples += x
						}
						for _, li := range d.StackTable[s.StackIndex].LocationIndices {
							l := d.LocationTable[li]
							for _, a := range attrs(l.AttributeIndices) {
								if kind, ok := strings.CutPrefix(a, "profile.frame.type="); ok {
									v.FrameTypes[kind] = true
								}
							}
							if l.MappingIndex != 0 {
								m := d.MappingTable[l.MappingIndex]
								v.Mappings[d.StringTable[m.FilenameStrindex]] = attrs(m.AttributeIndices)
							}
							for _, ln := range l.Lines {
								v.Functions[d.StringTable[d.FunctionTable[ln.FunctionIndex].NameStrindex]] = true
							}
						}
					}
				}
			}
		}
	}
	return v
}

func value(d *profilespb.ProfilesDictionary, a *commonpb.AnyValue) any {
	switch x := a.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_StringValueStrindex:
		return d.StringTable[x.StringValueStrindex]
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	default:
		return a.String()
	}
}

// Port is the port the collector listens on, to start another on it.
func (c *Collector) Port() int {
	_, port, _ := net.SplitHostPort(c.Endpoint)
	p, _ := strconv.Atoi(port)
	return p
}
