package e2e

// Trace/span links end to end: programs that publish what span each thread or goroutine
// is in, sonde sampling them, and a real collector receiving both the profiles and, for
// the Go service, its traces.

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
)

// linkedSample is one CPU sample as the collector has it, with what the tests check.
type linkedSample struct {
	resource  map[string]any
	tid       int64
	time      uint64 // unix ns; 0 without timestamps
	count     int64
	traceID   string // hex; empty without a link
	spanID    string
	attrs     map[string]any
	functions []string // leaf first
}

// linkedSamples lists the samples in msgs, one entry per timestamp when they have them.
func linkedSamples(msgs []*profilespb.ProfilesData) []linkedSample {
	var out []linkedSample
	for _, r := range flatten(msgs) {
		for _, s := range r.profile.Samples {
			ls := linkedSample{resource: r.resource, attrs: r.attrs(s.AttributeIndices)}
			if tid, ok := ls.attrs["thread.id"].(int64); ok {
				ls.tid = tid
			}
			if s.LinkIndex != 0 {
				l := r.dict.LinkTable[s.LinkIndex]
				ls.traceID, ls.spanID = hex.EncodeToString(l.TraceId), hex.EncodeToString(l.SpanId)
			}
			ls.functions, _ = r.frames(s)
			if len(s.TimestampsUnixNano) == 0 {
				ls.count = sampleWeight(s)
				out = append(out, ls)
				continue
			}
			for _, ts := range s.TimestampsUnixNano {
				c := ls
				c.time, c.count = ts, 1
				out = append(out, c)
			}
		}
	}
	return out
}

// startReady runs cmd, killed when t ends, and waits for it to print "ready". It returns
// the rest of its standard output as it comes.
func startReady(t *testing.T, cmd *exec.Cmd) *bufio.Scanner {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	ready := make(chan bool, 1)
	go func() { ready <- sc.Scan() && sc.Text() == "ready" }()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("%s did not say ready", cmd.Path)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("%s not ready within a minute", cmd.Path)
	}
	return sc
}

// span is one span a thread context program logged.
type span struct {
	tid                    int64
	start, end             uint64
	traceID, spanID, route string
	user                   string
}

// TestThreadContextLinks: a C program publishes an OpenTelemetry process context and a
// thread context as the OTEPs describe, its variable in the executable (static TLS), or in
// a library built with TLSDESC or the legacy global-dynamic dialect; two threads go from
// span to span and log when. At least 95 % of the samples link to the span that was active
// on their thread when they were taken, carry the span's attributes, and the resource
// carries the service.name the process published.
func TestThreadContextLinks(t *testing.T) {
	testenv.RequireRoot(t)
	sondeBinary(t)
	// Both schema names the merged OTEP uses.
	schemas := map[string]string{"exe": "tls_v1", "tlsdesc": "tlsdesc_v1_dev", "gd": "tls_v1"}
	CollectorBinary(t) // built once, before the variants start at once
	for _, variant := range testprog.ThreadContextVariants {
		t.Run(variant, func(t *testing.T) {
			// The variants run at once, each with its own collector and sonde: each
			// sonde's kernel filter keeps its own program's samples.
			t.Parallel()
			c := StartCollector(t)
			bin := testprog.BuildThreadContext(t, variant)
			service := "ctx-" + variant
			prog := exec.Command(bin, "9", service, schemas[variant])
			out := startReady(t, prog)
			spans := make(chan []span, 1)
			go func() {
				var got []span
				for out.Scan() {
					var s span
					if _, err := fmt.Sscanf(out.Text(), "span %d %d %d %s %s %s %s", &s.tid, &s.start, &s.end, &s.traceID, &s.spanID, &s.route, &s.user); err == nil {
						got = append(got, s)
					}
				}
				spans <- got
			}()
			s := startSonde(t, nil, "--pid", strconv.Itoa(prog.Process.Pid), "--duration", "6s", "--interval", "2s",
				"--frequency", strconv.Itoa(sondeFrequency), "--otlp-endpoint", c.Endpoint, "--otlp-insecure", "--timestamps",
				"--thread-attributes", "name,id", "--top", "0")
			if code := s.wait(t, 60*time.Second); code != 0 {
				t.Fatalf("sonde exit status %d", code)
			}
			sum := s.summary(t)
			waitDelivered(t, c, sum["otlp_sent_samples"])
			if err := prog.Wait(); err != nil {
				t.Fatalf("program: %v", err)
			}
			logged := <-spans
			if len(logged) < 50 {
				t.Fatalf("the program logged %d spans", len(logged))
			}
			msgs, err := c.Received()
			if err != nil {
				t.Fatal(err)
			}
			checkSpanLinks(t, linkedSamples(msgs), logged, service)
			t.Logf("kernel context counters: otel=%d invalid=%d torn=%d oversized=%d read_errors=%d",
				sum["kernel_context_otel"], sum["kernel_context_invalid"], sum["kernel_context_torn"], sum["kernel_context_oversized"], sum["kernel_context_read_errors"])
		})
	}
}

func checkSpanLinks(t *testing.T, samples []linkedSample, logged []span, service string) {
	t.Helper()
	byThread := map[int64][]span{}
	for _, s := range logged {
		byThread[s.tid] = append(byThread[s.tid], s)
	}
	for _, ss := range byThread {
		sort.Slice(ss, func(i, j int) bool { return ss[i].start < ss[j].start })
	}
	var total, linked, withAttrs int
	var wrong []string
	for _, s := range samples {
		if s.resource["service.name"] != service {
			t.Fatalf("resource %v: want the service.name the process published, %q", s.resource, service)
		}
		ss := byThread[s.tid]
		if len(ss) == 0 {
			continue // the main thread, waiting
		}
		if s.time == 0 {
			t.Fatalf("a sample without timestamps: %+v", s)
		}
		// The span whose logged interval holds the sample: the last one started before it.
		i := sort.Search(len(ss), func(i int) bool { return ss[i].start > s.time }) - 1
		if i < 0 || s.time > ss[len(ss)-1].end {
			continue // before the first span, or after the last
		}
		total++
		sp := ss[i]
		if s.traceID == sp.traceID && s.spanID == sp.spanID {
			linked++
			if s.attrs["http.route"] == sp.route && s.attrs["user"] == sp.user {
				withAttrs++
			}
		} else if len(wrong) < 5 {
			wrong = append(wrong, fmt.Sprintf("tid %d at %d: link %s/%s, want %s/%s", s.tid, s.time, s.traceID, s.spanID, sp.traceID, sp.spanID))
		}
	}
	if total < 200 {
		t.Fatalf("only %d samples of the span threads", total)
	}
	if share := float64(linked) / float64(total); share < 0.95 {
		t.Errorf("%d of %d samples (%.3f) link to the span active on their thread, want at least 0.95; for example:\n%s",
			linked, total, share, strings.Join(wrong, "\n"))
	}
	if withAttrs < linked*95/100 {
		t.Errorf("%d of %d linked samples carry their span's http.route and user", withAttrs, linked)
	}
	t.Logf("%d of %d samples link to their thread's span, %d with its attributes", linked, total, withAttrs)
}

// goService is the Go service of TestGoSpansLinkToTraces: its own module, which a Go 1.23
// toolchain can build, using the otelprofiling wrapper from this repository.
func goServiceDir() string { return filepath.Join(moduleDir(), "testdata", "gosvc") }

// buildGoService builds the service with the toolchain GOTOOLCHAIN names ("local": the
// one running the tests).
func buildGoService(t *testing.T, toolchain string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gosvc")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = goServiceDir()
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN="+toolchain, "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		testenv.Unavailable(t, "build the Go service with %s: %v\n%s", toolchain, err, out)
	}
	ver, err := exec.Command("go", "version", bin).CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", strings.TrimSpace(string(ver)))
	return bin
}

// TestGoSpansLinkToTraces: a Go service using the OpenTelemetry Go SDK with the
// otelprofiling wrapper exports its spans to the collector while sonde sends the
// service's profiles there. At least 95 % of the CPU samples taken inside spans link to a
// trace and span ID the collector received among the traces, and the profiles' resource
// names the service as its traces do. Built with today's Go (labels in a slice) and Go
// 1.23 (labels in a map).
func TestGoSpansLinkToTraces(t *testing.T) {
	testenv.RequireRoot(t)
	sondeBinary(t)
	CollectorBinary(t)
	for _, toolchain := range []string{"local", "go1.23.4"} {
		t.Run(toolchain, func(t *testing.T) {
			t.Parallel() // as TestThreadContextLinks' variants
			bin := buildGoService(t, toolchain)
			c := StartCollector(t)
			svc := exec.Command(bin, c.Endpoint, "9s")
			startReady(t, svc)
			s := startSonde(t, nil, "--pid", strconv.Itoa(svc.Process.Pid), "--duration", "6s", "--interval", "2s",
				"--frequency", strconv.Itoa(sondeFrequency), "--otlp-endpoint", c.Endpoint, "--otlp-insecure", "--top", "0")
			if code := s.wait(t, 60*time.Second); code != 0 {
				t.Fatalf("sonde exit status %d", code)
			}
			sum := s.summary(t)
			waitDelivered(t, c, sum["otlp_sent_samples"])
			if err := svc.Wait(); err != nil {
				t.Fatalf("service: %v", err)
			}
			// The service shuts its tracer provider down, which flushes its spans, before it exits.
			exported := map[string]bool{}
			for stable, deadline := 0, time.Now().Add(20*time.Second); stable < 5 && time.Now().Before(deadline); {
				traces, err := c.ReceivedTraces()
				if err != nil {
					t.Fatal(err)
				}
				before := len(exported)
				for _, td := range traces {
					for _, rs := range td.ResourceSpans {
						for _, ss := range rs.ScopeSpans {
							for _, sp := range ss.Spans {
								exported[hex.EncodeToString(sp.TraceId)+"/"+hex.EncodeToString(sp.SpanId)] = true
							}
						}
					}
				}
				if len(exported) > 0 && len(exported) == before {
					stable++
				}
				time.Sleep(200 * time.Millisecond)
			}
			if len(exported) < 20 {
				t.Fatalf("the collector has %d spans of the service", len(exported))
			}
			msgs, err := c.Received()
			if err != nil {
				t.Fatal(err)
			}
			var inSpans, linked int64
			var missing []string
			for _, s := range linkedSamples(msgs) {
				if s.resource["service.name"] != "gosvc-e2e" || s.resource["service.version"] != "1.2.3" {
					t.Fatalf("resource %v: want the service's own service.name and service.version", s.resource)
				}
				if !containsFunction(s.functions, "main.burn") {
					continue // the runtime, the exporter: outside spans
				}
				inSpans += s.count
				key := s.traceID + "/" + s.spanID
				if s.traceID != "" && exported[key] {
					linked += s.count
				} else if len(missing) < 5 {
					missing = append(missing, key)
				}
			}
			if inSpans < 200 {
				t.Fatalf("only %d samples inside spans", inSpans)
			}
			if share := float64(linked) / float64(inSpans); share < 0.95 {
				t.Errorf("%d of %d samples inside spans (%.3f) link to an exported span, want at least 0.95; unmatched: %v",
					linked, inSpans, share, missing)
			}
			t.Logf("%d of %d samples inside spans link to one of the %d exported spans", linked, inSpans, len(exported))
		})
	}
}

func containsFunction(names []string, want string) bool {
	for _, n := range names {
		if n == want {
			return true
		}
	}
	return false
}
