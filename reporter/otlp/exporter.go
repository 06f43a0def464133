package otlp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/profiles/v1development"
	"google.golang.org/grpc/status"

	"github.com/sonde-profiler/sonde/internal/retry"
	"github.com/sonde-profiler/sonde/trace"
)

// Option configures an Exporter.
type Option func(*Exporter)

// WithLogger sets where the Exporter reports outages, rejections and partial
// successes; by default it reports nowhere.
func WithLogger(l *slog.Logger) Option {
	return func(e *Exporter) {
		if l != nil {
			e.log = l
		}
	}
}

// WithResource sets the host resource EnqueueProfiles adds to every process.
func WithResource(r Resource) Option { return func(e *Exporter) { e.resource = r } }

// WithEncodeOptions sets how EnqueueProfiles encodes profiles.
func WithEncodeOptions(o EncodeOptions) Option { return func(e *Exporter) { e.encode = o } }

// Stats counts what an Exporter did since it was made.
type Stats struct {
	// SentRequests and SentSamples count the requests the collector accepted and the
	// CPU samples (sums of sample counts) in them.
	SentRequests, SentSamples uint64
	// SentBytes sums the encoded size of the requests the collector accepted: with
	// SentSamples, what a sample costs on the wire.
	SentBytes uint64
	// DroppedIntervals counts intervals dropped from a full queue, or still queued
	// when a shutdown could not deliver them.
	DroppedIntervals uint64
	// FailedAttempts counts export calls that failed, whether retried or not.
	FailedAttempts uint64
	// RejectedRequests counts requests dropped because the collector refused them in
	// a way that retrying cannot fix, such as InvalidArgument or Unimplemented.
	RejectedRequests uint64
	// RejectedProfiles sums the rejected_profiles of partial successes.
	RejectedProfiles int64
	// EncodeFailures counts request parts that could not be encoded and were dropped.
	EncodeFailures uint64
	// Shed counts the times the queue was emptied to give memory back.
	Shed uint64
	// Queued is how many intervals wait to be sent now, and QueuedBytes their size.
	Queued, QueuedBytes int
}

// Exporter sends requests to a collector from a bounded queue of intervals. Enqueue
// never blocks: when the queue is full the oldest interval goes. Run sends, and
// keeps retrying the oldest interval while the collector is unreachable.
type Exporter struct {
	cfg      Config
	log      *slog.Logger
	client   *client
	resource Resource
	encode   EncodeOptions

	wake chan struct{}
	// lastBytes is the size of the last request marshaled, the room the next starts with.
	lastBytes atomic.Int64

	mu    sync.Mutex
	queue []*batch
	stats Stats

	closeOnce sync.Once
	closeErr  error
}

// batch is one interval's request, split to fit the collector's size limit and kept
// marshaled: a queue of wire bytes is several times smaller than one of messages, which
// matters while a collector is away. Parts go in order; next is the first not yet sent.
type batch struct {
	parts   [][]byte
	samples []uint64
	bytes   int
	next    int
	// inFlight marks the batch Run is sending right now, which the queue must not
	// drop under it; between attempts it is dropped like any other.
	inFlight bool
}

// New makes an Exporter for cfg, whose zero fields take DefaultConfig's values. It
// does not connect: Run does, and keeps trying.
func New(cfg Config, opts ...Option) (*Exporter, error) {
	e := &Exporter{
		cfg:  cfg.withDefaults(),
		log:  slog.New(slog.DiscardHandler),
		wake: make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(e)
	}
	ua := "sonde"
	if e.encode.Version != "" {
		ua += "/" + e.encode.Version
	}
	c, err := newClient(e.cfg, ua)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	e.client = c
	return e, nil
}

// EnqueueProfiles encodes profiles as one interval and queues it.
func (e *Exporter) EnqueueProfiles(profiles ...*trace.Profile) error {
	return e.Enqueue(Encode(profiles, e.resource, e.encode))
}

// Enqueue queues req as one interval, split if it is too big for the collector. If
// the queue is full, in intervals or in bytes, it drops the oldest intervals to make
// room. A part that cannot be encoded is dropped alone, counted, and returned as the
// error: the rest of the interval still goes.
func (e *Exporter) Enqueue(req *collectorpb.ExportProfilesServiceRequest) error {
	if req == nil || len(req.ResourceProfiles) == 0 {
		return nil
	}
	b := &batch{}
	var errs []error
	add := func(p *collectorpb.ExportProfilesServiceRequest, raw []byte, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("otlp: encode request: %w", err))
			return
		}
		b.parts = append(b.parts, raw)
		b.samples = append(b.samples, countSamples(p))
		b.bytes += len(raw)
	}
	if raw, err := marshalRequest(req, int(e.lastBytes.Load()), MaxRequestBytes); err == nil {
		e.lastBytes.Store(int64(len(raw)))
		add(req, raw, nil)
	} else {
		// Too big for a collector, or holding a string that cannot be sent: cut it up,
		// so that only the parts that cannot be encoded are lost.
		for _, p := range Split(req, MaxRequestBytes) {
			raw, err := marshalRequest(p, 0, 0)
			add(p, raw, err)
		}
	}
	e.mu.Lock()
	e.stats.EncodeFailures += uint64(len(errs))
	if len(b.parts) == 0 {
		e.mu.Unlock()
		return errors.Join(errs...)
	}
	for e.waiting() > 0 && (e.waiting() >= e.cfg.QueueSize || (e.cfg.QueueBytes > 0 && e.queuedBytes()+b.bytes > e.cfg.QueueBytes)) {
		e.dropOldest()
	}
	e.queue = append(e.queue, b)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return errors.Join(errs...)
}

// queuedBytes is what the queue holds, the batch in flight included. Caller holds mu.
func (e *Exporter) queuedBytes() int {
	n := 0
	for _, b := range e.queue {
		n += b.bytes
	}
	return n
}

// Shed drops every queued interval not being sent, to give memory back under pressure,
// and returns how many bytes it let go.
func (e *Exporter) Shed() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	freed := 0
	for e.waiting() > 0 {
		freed += e.oldestWaiting().bytes
		e.dropOldest()
	}
	e.stats.Shed++
	return freed
}

func (e *Exporter) oldestWaiting() *batch {
	for _, b := range e.queue {
		if !b.inFlight {
			return b
		}
	}
	return nil
}

// waiting counts the queued batches not being sent; the queue holds at most
// QueueSize of them, plus the one in flight.
func (e *Exporter) waiting() int {
	n := len(e.queue)
	for _, b := range e.queue {
		if b.inFlight {
			n--
		}
	}
	return n
}

func (e *Exporter) dropOldest() {
	for i, b := range e.queue {
		if !b.inFlight {
			// slices.Delete clears the vacated slot: the queue keeps no dropped batch alive.
			e.queue = slices.Delete(e.queue, i, i+1)
			e.stats.DroppedIntervals++
			return
		}
	}
}

func countSamples(req *collectorpb.ExportProfilesServiceRequest) uint64 {
	var n uint64
	for _, rp := range req.ResourceProfiles {
		for _, sp := range rp.ScopeProfiles {
			for _, p := range sp.Profiles {
				for _, s := range p.Samples {
					if len(s.Values) == 0 {
						n += uint64(len(s.TimestampsUnixNano))
					}
					for _, v := range s.Values {
						if v > 0 {
							n += uint64(v)
						}
					}
				}
			}
		}
	}
	return n
}

// Stats returns the counts so far.
func (e *Exporter) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	s.Queued, s.QueuedBytes = len(e.queue), e.queuedBytes()
	return s
}

// outage is a time the collector could not be reached, reported when it starts and
// when it ends rather than at every failed attempt.
type outage struct {
	start            time.Time
	failedAtStart    uint64
	droppedAtStart   uint64
	rejectedAtStart  uint64
	permanentFailure bool // the collector answers, but refuses the data
}

// Run sends queued intervals until ctx ends, then makes one last attempt, bounded by
// Config.Timeout, to deliver what is still queued. It returns an error only if that
// last attempt leaves intervals undelivered. An Exporter runs once: Run closes its
// connection when it returns.
func (e *Exporter) Run(ctx context.Context) error {
	defer e.Close()
	var (
		attempt int
		trouble *outage
	)
	for {
		if ctx.Err() != nil {
			return e.drain(trouble)
		}
		b, part := e.head()
		if b == nil {
			select {
			case <-ctx.Done():
			case <-e.wake:
			}
			continue
		}
		// A shutdown must not cut a request the collector may already have taken: drain
		// would send it again. The request's own timeout bounds the wait.
		resp, err := e.client.export(context.WithoutCancel(ctx), part)
		if err == nil {
			e.delivered(b, resp)
			attempt = 0
			trouble = e.recover(trouble)
			continue
		}
		retriable, wait := classify(err)
		if !retriable {
			e.release(b, true)
			attempt = 0
			if trouble != nil && !trouble.permanentFailure {
				// It answered, so the outage is over, refusal or not.
				trouble = e.recover(trouble)
			}
			if trouble == nil {
				trouble = e.startOutage(err, true)
			}
			continue
		}
		e.release(b, false)
		if trouble == nil || trouble.permanentFailure {
			trouble = e.startOutage(err, false)
		}
		if wait == 0 {
			wait = retry.Backoff(e.cfg.RetryInitial, e.cfg.RetryMax, attempt)
		}
		attempt++
		retry.Sleep(ctx, wait)
	}
}

// head marks the oldest batch in flight and returns it with its next part.
func (e *Exporter) head() (*batch, []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.queue) == 0 {
		return nil, nil
	}
	b := e.queue[0]
	b.inFlight = true
	return b, b.parts[b.next]
}

// delivered records that the collector took b's next part.
func (e *Exporter) delivered(b *batch, resp *collectorpb.ExportProfilesServiceResponse) {
	e.mu.Lock()
	e.stats.SentRequests++
	e.stats.SentSamples += b.samples[b.next]
	e.stats.SentBytes += uint64(len(b.parts[b.next]))
	e.advance(b)
	ps := resp.GetPartialSuccess()
	if ps.GetRejectedProfiles() > 0 {
		e.stats.RejectedProfiles += ps.GetRejectedProfiles()
	}
	e.mu.Unlock()
	if ps.GetRejectedProfiles() > 0 || ps.GetErrorMessage() != "" {
		e.log.Warn("otlp: collector accepted profiles only in part",
			"rejected_profiles", ps.GetRejectedProfiles(), "message", ps.GetErrorMessage())
	}
}

// release ends a failed attempt to send b's next part; rejected also drops the
// part, which no retry would get accepted.
func (e *Exporter) release(b *batch, rejected bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b.inFlight = false
	e.stats.FailedAttempts++
	if rejected {
		e.stats.RejectedRequests++
		e.advance(b)
	}
}

// advance moves past b's next part, and past b once all its parts are done. Caller
// holds mu.
func (e *Exporter) advance(b *batch) {
	b.inFlight = false
	b.next++
	if b.next < len(b.parts) {
		return
	}
	for i, q := range e.queue {
		if q == b {
			e.queue = slices.Delete(e.queue, i, i+1)
			return
		}
	}
}

func (e *Exporter) startOutage(err error, permanent bool) *outage {
	e.mu.Lock()
	o := &outage{
		start:            time.Now(),
		failedAtStart:    e.stats.FailedAttempts - 1, // this failure is part of the outage
		droppedAtStart:   e.stats.DroppedIntervals,
		rejectedAtStart:  e.stats.RejectedRequests - boolToUint(permanent),
		permanentFailure: permanent,
	}
	e.mu.Unlock()
	if permanent {
		e.log.Error("otlp: collector refuses profiles, dropping them until it accepts them again",
			"endpoint", e.cfg.Endpoint, "code", status.Code(err).String(), "err", err)
	} else {
		e.log.Warn("otlp: cannot deliver profiles, queueing them and retrying",
			"endpoint", e.cfg.Endpoint, "code", status.Code(err).String(), "err", err,
			"queue_size", e.cfg.QueueSize)
	}
	return o
}

// recover reports the end of o, if any, and returns nil.
func (e *Exporter) recover(o *outage) *outage {
	if o == nil {
		return nil
	}
	s := e.Stats()
	if o.permanentFailure {
		e.log.Info("otlp: collector accepts profiles again",
			"endpoint", e.cfg.Endpoint, "after", time.Since(o.start).Round(time.Millisecond),
			"rejected_requests", s.RejectedRequests-o.rejectedAtStart)
	} else {
		e.log.Info("otlp: collector reachable again",
			"endpoint", e.cfg.Endpoint, "after", time.Since(o.start).Round(time.Millisecond),
			"failed_attempts", s.FailedAttempts-o.failedAtStart,
			"dropped_intervals", s.DroppedIntervals-o.droppedAtStart)
	}
	return nil
}

func boolToUint(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// drain tries, once, within Config.Timeout, to deliver what is queued.
func (e *Exporter) drain(trouble *outage) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	for {
		b, part := e.head()
		if b == nil {
			e.recover(trouble)
			return nil
		}
		resp, err := e.client.export(ctx, part)
		if err == nil {
			e.delivered(b, resp)
			continue
		}
		if retriable, _ := classify(err); !retriable && ctx.Err() == nil {
			e.release(b, true)
			continue
		}
		e.release(b, false)
		e.mu.Lock()
		n := len(e.queue)
		e.queue = nil
		e.stats.DroppedIntervals += uint64(n)
		e.mu.Unlock()
		return fmt.Errorf("otlp: %d intervals undelivered at shutdown: %w", n, err)
	}
}

// Close closes the connection to the collector. Run calls it; call it yourself only
// for an Exporter that never ran.
func (e *Exporter) Close() error {
	e.closeOnce.Do(func() {
		if err := e.client.close(); err != nil && !errors.Is(err, context.Canceled) {
			e.closeErr = fmt.Errorf("otlp: close connection: %w", err)
		}
	})
	return e.closeErr
}

func (s Stats) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Uint64("sent_requests", s.SentRequests), slog.Uint64("sent_samples", s.SentSamples), slog.Uint64("sent_bytes", s.SentBytes),
		slog.Uint64("dropped_intervals", s.DroppedIntervals), slog.Uint64("failed_attempts", s.FailedAttempts),
		slog.Uint64("rejected_requests", s.RejectedRequests), slog.Uint64("encode_failures", s.EncodeFailures),
		slog.Int("queued", s.Queued), slog.Int("queued_bytes", s.QueuedBytes), slog.Uint64("sheds", s.Shed))
}
