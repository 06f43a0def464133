// Package otelprofiling lets a continuous profiler such as sonde tell which span a Go
// service's CPU time went to, and which service it is, with three lines in the service.
//
// Wrap wraps an OpenTelemetry TracerProvider: every span it starts sets the pprof labels
// trace_id and span_id (lowercase hex) on the goroutine that started it, and goroutines
// that goroutine starts inherit them, as the Go runtime does with labels; the span's End
// sets the labels of the context the span was started from back. A profiler reading the
// running goroutine's labels at each sample (OTEP 4947 leaves Go to pprof labels) then
// links the sample to the span. Wrap also publishes the service's resource as an
// OpenTelemetry process context (OTEP 4719) with threadlocal.schema_version
// go_pprof_labels_v1, so the profiler names the service as its traces do.
//
//	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(exporter))
//	otel.SetTracerProvider(otelprofiling.Wrap(tp, res))
//	defer tp.Shutdown(ctx)
//
// End restores labels on the goroutine that calls it: a span ended on another goroutine
// than the one that started it leaves the starter's labels as they were. The process
// context is published on Linux only; elsewhere Wrap only sets labels.
//
// It is a module of its own, requiring Go 1.23 and nothing past the OpenTelemetry API, so
// that a service adopting it takes none of the profiler's dependencies.
package otelprofiling
