package otelprofiling

import (
	"context"
	"encoding/hex"
	"runtime/pprof"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// Label keys the span's IDs are set under.
const (
	LabelTraceID = "trace_id"
	LabelSpanID  = "span_id"
)

// Resource is what Wrap publishes of the service: *resource.Resource of the SDK is one.
type Resource interface {
	Attributes() []attribute.KeyValue
}

// Wrap returns a TracerProvider whose spans label their goroutine with their IDs, and
// publishes res (which may be nil) as the process's context. Spans that are not recording
// and have no valid span context leave labels alone.
func Wrap(tp trace.TracerProvider, res Resource) trace.TracerProvider {
	var attrs []attribute.KeyValue
	if res != nil {
		attrs = res.Attributes()
	}
	// A process without a published context still gets its labels read.
	_ = publish(encodeContext(attrs))
	return &provider{inner: tp}
}

type provider struct {
	embedded.TracerProvider
	inner trace.TracerProvider
}

func (p *provider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return &tracer{inner: p.inner.Tracer(name, opts...)}
}

type tracer struct {
	embedded.Tracer
	inner trace.Tracer
}

func (t *tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := ctx
	ctx, span := t.inner.Start(ctx, name, opts...)
	sc := span.SpanContext()
	if !sc.IsValid() {
		return ctx, span
	}
	tid, sid := sc.TraceID(), sc.SpanID()
	ctx = pprof.WithLabels(ctx, pprof.Labels(LabelTraceID, hex.EncodeToString(tid[:]), LabelSpanID, hex.EncodeToString(sid[:])))
	pprof.SetGoroutineLabels(ctx)
	return ctx, &labeledSpan{Span: span, parent: parent}
}

// labeledSpan restores the parent context's labels when it ends.
type labeledSpan struct {
	trace.Span
	parent context.Context
}

func (s *labeledSpan) End(opts ...trace.SpanEndOption) {
	s.Span.End(opts...)
	pprof.SetGoroutineLabels(s.parent)
}
