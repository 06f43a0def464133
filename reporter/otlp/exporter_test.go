package otlp

import (
	"context"
	"errors"
	"fmt"
	"google.golang.org/protobuf/proto"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/profiles/v1development"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sonde-profiler/sonde/trace"
)

func TestClassify(t *testing.T) {
	withRetryInfo := func(c codes.Code, d time.Duration) error {
		st, err := status.New(c, "busy").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	for _, c := range []struct {
		err   error
		retry bool
		wait  time.Duration
	}{
		{status.Error(codes.Canceled, ""), true, 0},
		{status.Error(codes.DeadlineExceeded, ""), true, 0},
		{status.Error(codes.Aborted, ""), true, 0},
		{status.Error(codes.OutOfRange, ""), true, 0},
		{status.Error(codes.Unavailable, ""), true, 0},
		{status.Error(codes.DataLoss, ""), true, 0},
		{status.Error(codes.ResourceExhausted, ""), false, 0},
		{withRetryInfo(codes.ResourceExhausted, 3*time.Second), true, 3 * time.Second},
		{withRetryInfo(codes.Unavailable, 2*time.Second), true, 2 * time.Second},
		{status.Error(codes.Unknown, ""), false, 0},
		{status.Error(codes.InvalidArgument, ""), false, 0},
		{status.Error(codes.NotFound, ""), false, 0},
		{status.Error(codes.AlreadyExists, ""), false, 0},
		{status.Error(codes.PermissionDenied, ""), false, 0},
		{status.Error(codes.FailedPrecondition, ""), false, 0},
		{status.Error(codes.Unimplemented, ""), false, 0},
		{status.Error(codes.Internal, ""), false, 0},
		{status.Error(codes.Unauthenticated, ""), false, 0},
		{errors.New("not grpc"), false, 0},
	} {
		retry, wait := classify(c.err)
		if retry != c.retry || wait != c.wait {
			t.Errorf("%v: retry=%v wait=%v, want %v %v", c.err, retry, wait, c.retry, c.wait)
		}
	}
}

// request makes a distinct small request for interval i.
func request(i int) *collectorpb.ExportProfilesServiceRequest {
	f := newFixture()
	f.profile.Start = t0.Add(time.Duration(i) * 10 * time.Second)
	f.profile.End = f.profile.Start.Add(10 * time.Second)
	return Encode([]*trace.Profile{f.profile}, testHost, EncodeOptions{})
}

func intervalOf(req *collectorpb.ExportProfilesServiceRequest) int {
	ns := req.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].TimeUnixNano
	return int((time.Duration(ns) - time.Duration(t0.UnixNano())) / (10 * time.Second))
}

// partInterval is intervalOf for a queued, marshaled part.
func partInterval(t *testing.T, raw []byte) int {
	t.Helper()
	req := new(collectorpb.ExportProfilesServiceRequest)
	if err := proto.Unmarshal(raw, req); err != nil {
		t.Fatal(err)
	}
	return intervalOf(req)
}

func TestQueueDropsOldest(t *testing.T) {
	e, err := New(Config{Endpoint: "127.0.0.1:1", Insecure: true, QueueSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for i := range 5 {
		e.Enqueue(request(i))
	}
	e.Enqueue(nil) // ignored
	s := e.Stats()
	if s.DroppedIntervals != 2 || s.Queued != 3 {
		t.Errorf("dropped %d queued %d, want 2 and 3", s.DroppedIntervals, s.Queued)
	}
	var got []int
	for _, b := range e.queue {
		got = append(got, partInterval(t, b.parts[0]))
	}
	if fmt.Sprint(got) != "[2 3 4]" {
		t.Errorf("queue holds intervals %v, want the newest [2 3 4]", got)
	}

	// The batch being sent is not dropped under the sender: the queue holds
	// QueueSize batches besides it.
	b, _ := e.head()
	e.Enqueue(request(5))
	e.Enqueue(request(6))
	got = got[:0]
	for _, b := range e.queue {
		got = append(got, partInterval(t, b.parts[0]))
	}
	if e.queue[0] != b || fmt.Sprint(got) != "[2 4 5 6]" {
		t.Errorf("queue holds intervals %v, want the in-flight 2 and the newest [4 5 6]", got)
	}
	if s := e.Stats(); s.DroppedIntervals != 3 {
		t.Errorf("dropped %d, want 3", s.DroppedIntervals)
	}
}

// fakeCollector is an in-process ProfilesService.
type fakeCollector struct {
	collectorpb.UnimplementedProfilesServiceServer
	addr string

	mu       sync.Mutex
	calls    []time.Time
	received []*collectorpb.ExportProfilesServiceRequest
	metadata []metadata.MD
	// reply decides the answer to call n (from 0); nil means OK.
	reply func(n int) (*collectorpb.ExportProfilesServiceResponse, error)
}

func startCollector(t *testing.T, reply func(n int) (*collectorpb.ExportProfilesServiceResponse, error)) *fakeCollector {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fc := &fakeCollector{addr: lis.Addr().String(), reply: reply}
	srv := grpc.NewServer()
	collectorpb.RegisterProfilesServiceServer(srv, fc)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return fc
}

func (fc *fakeCollector) Export(ctx context.Context, req *collectorpb.ExportProfilesServiceRequest) (*collectorpb.ExportProfilesServiceResponse, error) {
	fc.mu.Lock()
	n := len(fc.calls)
	fc.calls = append(fc.calls, time.Now())
	md, _ := metadata.FromIncomingContext(ctx)
	fc.metadata = append(fc.metadata, md)
	fc.mu.Unlock()
	if fc.reply != nil {
		resp, err := fc.reply(n)
		if err != nil || resp != nil {
			return resp, err
		}
	}
	fc.mu.Lock()
	fc.received = append(fc.received, req)
	fc.mu.Unlock()
	return &collectorpb.ExportProfilesServiceResponse{}, nil
}

func (fc *fakeCollector) snapshot() (calls []time.Time, received []*collectorpb.ExportProfilesServiceRequest, md []metadata.MD) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return append([]time.Time(nil), fc.calls...), append([]*collectorpb.ExportProfilesServiceRequest(nil), fc.received...), append([]metadata.MD(nil), fc.metadata...)
}

// logRecorder keeps log records for inspection.
type logRecorder struct {
	mu      sync.Mutex
	records []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	l.records = append(l.records, b.String())
	l.mu.Unlock()
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) matching(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.records {
		if strings.Contains(r, s) {
			out = append(out, r)
		}
	}
	return out
}

func testConfig(addr string) Config {
	return Config{
		Endpoint:     addr,
		Insecure:     true,
		Timeout:      2 * time.Second,
		RetryInitial: 5 * time.Millisecond,
		RetryMax:     20 * time.Millisecond,
		Headers:      map[string]string{"X-Tenant": "t1"},
	}
}

// run starts e.Run and returns a function that stops it and returns its error.
func run(t *testing.T, e *Exporter) func() error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return after cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestExporterRetriesUnavailable(t *testing.T) {
	fc := startCollector(t, func(n int) (*collectorpb.ExportProfilesServiceResponse, error) {
		if n < 3 {
			return nil, status.Error(codes.Unavailable, "starting up")
		}
		return nil, nil
	})
	logs := &logRecorder{}
	e, err := New(testConfig(fc.addr), WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, e)
	e.Enqueue(request(0))
	waitFor(t, "delivery", func() bool { return e.Stats().SentRequests == 1 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}

	calls, received, md := fc.snapshot()
	if len(calls) != 4 || len(received) != 1 {
		t.Errorf("%d calls, %d delivered; want 4 and 1", len(calls), len(received))
	}
	if intervalOf(received[0]) != 0 || len(canonicalSamples(received[0])) != len(canonicalSamples(request(0))) {
		t.Errorf("delivered request differs from the queued one")
	}
	// Failed attempts count no bytes: only what the collector took.
	if got, want := e.Stats().SentBytes, uint64(proto.Size(received[0])); got != want {
		t.Errorf("SentBytes = %d, want the delivered request's %d", got, want)
	}
	if got := md[0].Get("x-tenant"); len(got) != 1 || got[0] != "t1" {
		t.Errorf("header x-tenant = %v", got)
	}
	s := e.Stats()
	if s.FailedAttempts != 3 || s.SentSamples != 11 || s.Queued != 0 || s.DroppedIntervals != 0 {
		t.Errorf("stats = %+v", s)
	}
	// One outage, reported once when it starts and once when it ends.
	if got := logs.matching("cannot deliver"); len(got) != 1 {
		t.Errorf("outage reported %d times: %q", len(got), got)
	}
	if got := logs.matching("reachable again"); len(got) != 1 || !strings.Contains(got[0], "failed_attempts=3") || !strings.Contains(got[0], "dropped_intervals=0") {
		t.Errorf("outage end = %q", got)
	}
}

func TestExporterHonoursRetryInfo(t *testing.T) {
	const delay = 300 * time.Millisecond
	fc := startCollector(t, func(n int) (*collectorpb.ExportProfilesServiceResponse, error) {
		if n == 0 {
			st, _ := status.New(codes.ResourceExhausted, "slow down").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
			return nil, st.Err()
		}
		return nil, nil
	})
	e, err := New(testConfig(fc.addr))
	if err != nil {
		t.Fatal(err)
	}
	run(t, e)
	e.Enqueue(request(0))
	waitFor(t, "delivery", func() bool { return e.Stats().SentRequests == 1 })
	calls, _, _ := fc.snapshot()
	if len(calls) != 2 {
		t.Fatalf("%d calls, want 2", len(calls))
	}
	if gap := calls[1].Sub(calls[0]); gap < delay {
		t.Errorf("retried after %v, the collector asked for %v", gap, delay)
	}
}

func TestExporterDropsRejected(t *testing.T) {
	// ResourceExhausted without RetryInfo, then InvalidArgument: neither is retried.
	fc := startCollector(t, func(n int) (*collectorpb.ExportProfilesServiceResponse, error) {
		switch n {
		case 0:
			return nil, status.Error(codes.ResourceExhausted, "too big")
		case 1:
			return nil, status.Error(codes.InvalidArgument, "bad data")
		}
		return nil, nil
	})
	logs := &logRecorder{}
	e, err := New(testConfig(fc.addr), WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	run(t, e)
	for i := range 3 {
		e.Enqueue(request(i))
	}
	waitFor(t, "the third request", func() bool { return e.Stats().SentRequests == 1 })
	calls, received, _ := fc.snapshot()
	if len(calls) != 3 || intervalOf(received[0]) != 2 {
		t.Errorf("%d calls, delivered interval %d; want 3 calls and interval 2", len(calls), intervalOf(received[0]))
	}
	if s := e.Stats(); s.RejectedRequests != 2 || s.FailedAttempts != 2 {
		t.Errorf("stats = %+v", s)
	}
	if got := logs.matching("refuses profiles"); len(got) != 1 {
		t.Errorf("refusal reported %d times: %q", len(got), got)
	}
	if got := logs.matching("accepts profiles again"); len(got) != 1 || !strings.Contains(got[0], "rejected_requests=2") {
		t.Errorf("recovery = %q", got)
	}
}

func TestExporterPartialSuccess(t *testing.T) {
	fc := startCollector(t, func(n int) (*collectorpb.ExportProfilesServiceResponse, error) {
		return &collectorpb.ExportProfilesServiceResponse{PartialSuccess: &collectorpb.ExportProfilesPartialSuccess{
			RejectedProfiles: 1, ErrorMessage: "profile without samples",
		}}, nil
	})
	logs := &logRecorder{}
	e, err := New(testConfig(fc.addr), WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	run(t, e)
	e.Enqueue(request(0))
	waitFor(t, "delivery", func() bool { return e.Stats().SentRequests == 1 })
	if s := e.Stats(); s.RejectedProfiles != 1 {
		t.Errorf("rejected profiles = %d, want 1", s.RejectedProfiles)
	}
	if got := logs.matching("only in part"); len(got) != 1 || !strings.Contains(got[0], "rejected_profiles=1") || !strings.Contains(got[0], "profile without samples") {
		t.Errorf("partial success log = %q", got)
	}
}

func TestExporterOutageKeepsNewest(t *testing.T) {
	var mu sync.Mutex
	down := true
	fc := startCollector(t, func(n int) (*collectorpb.ExportProfilesServiceResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return nil, status.Error(codes.Unavailable, "down")
		}
		return nil, nil
	})
	logs := &logRecorder{}
	cfg := testConfig(fc.addr)
	cfg.QueueSize = 3
	e, err := New(cfg, WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	run(t, e)
	start := time.Now()
	for i := range 10 {
		e.Enqueue(request(i))
		time.Sleep(2 * time.Millisecond)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("enqueueing during an outage took %v", d)
	}
	waitFor(t, "retries", func() bool { return e.Stats().FailedAttempts >= 5 })
	mu.Lock()
	down = false
	mu.Unlock()
	waitFor(t, "the queue to drain", func() bool { return e.Stats().Queued == 0 })
	_, received, _ := fc.snapshot()
	var got []int
	for _, r := range received {
		got = append(got, intervalOf(r))
	}
	// The newest three survive, plus possibly one that was in flight when they came.
	if n := len(got); n < 3 || n > 4 || fmt.Sprint(got[n-3:]) != "[7 8 9]" {
		t.Errorf("delivered intervals %v, want the newest ones ending [7 8 9]", got)
	}
	s := e.Stats()
	if s.DroppedIntervals+uint64(len(got)) != 10 {
		t.Errorf("dropped %d + delivered %d != 10 enqueued", s.DroppedIntervals, len(got))
	}
	if n := len(logs.matching("cannot deliver")); n != 1 {
		t.Errorf("outage reported %d times", n)
	}
	end := logs.matching("reachable again")
	if len(end) != 1 || !strings.Contains(end[0], fmt.Sprintf("dropped_intervals=%d", s.DroppedIntervals)) {
		t.Errorf("outage end = %q, want dropped_intervals=%d", end, s.DroppedIntervals)
	}
}

func TestExporterCollectorComesBack(t *testing.T) {
	// Nothing listens at first: the connection itself fails.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	logs := &logRecorder{}
	e, err := New(testConfig(addr), WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	run(t, e)
	e.Enqueue(request(0))
	waitFor(t, "failed attempts", func() bool { return e.Stats().FailedAttempts >= 3 })

	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	fc := &fakeCollector{addr: addr}
	srv := grpc.NewServer()
	collectorpb.RegisterProfilesServiceServer(srv, fc)
	go srv.Serve(lis)
	defer srv.Stop()
	start := time.Now()
	waitFor(t, "delivery once the collector is up", func() bool { return e.Stats().SentRequests == 1 })
	// Reconnection follows the retry schedule (RetryMax 20ms here), not gRPC's
	// default of up to 2 minutes.
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("delivered %v after the collector came back", d)
	}
	if n := len(logs.matching("cannot deliver")); n != 1 {
		t.Errorf("outage reported %d times", n)
	}
	if n := len(logs.matching("reachable again")); n != 1 {
		t.Errorf("outage end reported %d times", n)
	}
}

func TestExporterFlushesOnShutdown(t *testing.T) {
	fc := startCollector(t, nil)
	e, err := New(testConfig(fc.addr))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		e.Enqueue(request(i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // already stopping: only the last attempt runs
	if err := e.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, received, _ := fc.snapshot(); len(received) != 3 {
		t.Errorf("delivered %d of 3 queued intervals at shutdown", len(received))
	}
}

func TestExporterShutdownBounded(t *testing.T) {
	// Nothing listens: the last attempt fails, within the timeout.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	cfg := testConfig(addr)
	cfg.Timeout = 500 * time.Millisecond
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, e)
	e.Enqueue(request(0))
	e.Enqueue(request(1))
	waitFor(t, "a failed attempt", func() bool { return e.Stats().FailedAttempts > 0 })
	start := time.Now()
	err = stop()
	if err == nil || !strings.Contains(err.Error(), "2 intervals undelivered") {
		t.Errorf("Run = %v, want 2 intervals undelivered", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("shutdown took %v with a %v timeout", d, cfg.Timeout)
	}
	if s := e.Stats(); s.DroppedIntervals != 2 || s.Queued != 0 {
		t.Errorf("stats = %+v", s)
	}
}

func TestExporterSplitsLargeIntervals(t *testing.T) {
	fc := startCollector(t, nil)
	e, err := New(testConfig(fc.addr))
	if err != nil {
		t.Fatal(err)
	}
	run(t, e)
	big := synthetic(3, 2, 12000, 6000, 22, 400, t0)
	e.EnqueueProfiles(big)
	waitFor(t, "delivery", func() bool { return e.Stats().Queued == 0 })
	_, received, _ := fc.snapshot()
	if len(received) < 2 {
		t.Fatalf("an interval over 4 MiB went as %d request(s)", len(received))
	}
	var samples uint64
	for _, r := range received {
		samples += countSamples(r)
	}
	if want := uint64(big.TotalCount()); samples != want || e.Stats().SentSamples != want {
		t.Errorf("delivered %d samples (stats %d), want %d", samples, e.Stats().SentSamples, want)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Endpoint: "ftp://x"},
		{Endpoint: "x:1", Compression: "zstd"},
		{Endpoint: "x:1", ClientCert: "/c.pem"},
		{Endpoint: "x:1", CertFile: "/nonexistent/ca.pem"},
	} {
		if e, err := New(cfg); err == nil {
			e.Close()
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	e, err := New(Config{})
	if err != nil {
		t.Fatalf("New with defaults: %v", err)
	}
	e.Close()
}

// The queue is bounded in bytes as well as in intervals, and Shed empties it on demand.
func TestQueueBoundedInBytes(t *testing.T) {
	one, err := proto.Marshal(request(0))
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Endpoint: "127.0.0.1:1", Insecure: true, QueueSize: 100, QueueBytes: 3*len(one) + len(one)/2})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for i := range 10 {
		if err := e.Enqueue(request(i)); err != nil {
			t.Fatal(err)
		}
	}
	s := e.Stats()
	if s.Queued != 3 || s.DroppedIntervals != 7 || s.QueuedBytes > 3*len(one)+len(one)/2 {
		t.Errorf("stats %+v: want the newest 3 intervals within the byte bound", s)
	}
	if freed := e.Shed(); freed < 2*len(one) || e.Stats().Queued != 0 || e.Stats().Shed != 1 {
		t.Errorf("shed %d bytes, stats %+v; want the queue emptied and counted", freed, e.Stats())
	}
}

// An interval that cannot be encoded is counted and returned, not queued; the next one
// goes as usual.
func TestEnqueueCountsEncodeFailures(t *testing.T) {
	e, err := New(testConfig("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	bad := request(0)
	bad.Dictionary.StringTable = append(bad.Dictionary.StringTable, "\xffname")
	if err := e.Enqueue(bad); !errors.Is(err, errNotUTF8) {
		t.Fatalf("enqueue: %v, want errNotUTF8", err)
	}
	if s := e.Stats(); s.EncodeFailures != 1 || s.Queued != 0 {
		t.Fatalf("after a bad interval: %d encode failures, %d queued; want 1 and 0", s.EncodeFailures, s.Queued)
	}
	if err := e.Enqueue(request(1)); err != nil {
		t.Fatal(err)
	}
	if s := e.Stats(); s.EncodeFailures != 1 || s.Queued != 1 {
		t.Fatalf("after a good interval: %d encode failures, %d queued; want 1 and 1", s.EncodeFailures, s.Queued)
	}
}
