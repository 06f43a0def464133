// Command gosvc is the Go service of TestGoSpansLinkToTraces: it exports its spans over
// OTLP to the collector at os.Args[1], for os.Args[2], burning CPU inside nested spans on
// two goroutines, its tracer provider wrapped by otelprofiling.
package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sonde-profiler/sonde/otelprofiling"
)

var sink uint64

//go:noinline
func burn(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		for i := 0; i < 20000; i++ {
			sink = sink*31 + uint64(i)
		}
	}
}

func main() {
	ctx := context.Background()
	run, err := time.ParseDuration(os.Args[2])
	if err != nil {
		panic(err)
	}
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(os.Args[1]), otlptracegrpc.WithInsecure())
	if err != nil {
		panic(err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", "gosvc-e2e"), attribute.String("service.version", "1.2.3"))
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(exp))
	otel.SetTracerProvider(otelprofiling.Wrap(tp, res))
	fmt.Println("ready")

	tracer := otel.Tracer("gosvc")
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for end := time.Now().Add(run); time.Now().Before(end); {
				ctx, outer := tracer.Start(ctx, "request")
				burn(20 * time.Millisecond)
				_, inner := tracer.Start(ctx, "query")
				burn(20 * time.Millisecond)
				inner.End()
				// Back in the outer span: its labels again.
				burn(10 * time.Millisecond)
				outer.End()
			}
		}()
	}
	wg.Wait()
	if err := tp.Shutdown(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "shutdown:", err)
		os.Exit(1)
	}
}
