// Package tracectx reads what a process publishes about the work its threads do, so that
// each sample can name the span it was taken in: OpenTelemetry's process context (OTEP
// 4719: a named mapping holding the process's resource and the thread context's key map),
// OpenTelemetry's thread context (OTEP 4947: a TLS variable, otel_thread_ctx_v1, pointing
// at a record with trace-id, span-id and attributes), and Go's goroutine pprof labels.
//
// The kernel copies the thread context or the labels at each sample; this package finds,
// once per process, what the kernel needs for that (where the TLS variable is for every
// access model a reader must handle, where a Go runtime keeps the current goroutine and its
// labels), and parses what the kernel copied. Everything it reads comes from the process
// and is hostile input: it is bounded, checked, and what is invalid or torn is reported as
// an error for the caller to count, never guessed at.
package tracectx
