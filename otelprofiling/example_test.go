package otelprofiling_test

import (
	"context"
	"fmt"
	"runtime/pprof"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"

	"github.com/sonde-profiler/sonde/otelprofiling"
)

func Example() {
	ctx := context.Background()
	res := resource.NewSchemaless(semconv.ServiceName("checkout"), semconv.ServiceVersion("1.4.2"))
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res)) // and an exporter: sdktrace.WithBatcher(…)
	otel.SetTracerProvider(otelprofiling.Wrap(tp, res))
	defer tp.Shutdown(ctx)

	ctx, span := otel.Tracer("checkout").Start(ctx, "charge")
	// Samples of this goroutine, and of those it starts, now link to the span.
	label, _ := pprof.Label(ctx, otelprofiling.LabelSpanID)
	fmt.Println(label == span.SpanContext().SpanID().String())
	span.End()
	// Output: true
}
