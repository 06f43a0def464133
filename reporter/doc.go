// Package reporter is the last stage: its sub-packages turn flushed profiles into what
// people and backends read. pprof writes gzip pprof files, top prints the terminal summary,
// otlp encodes OpenTelemetry profiles and delivers them to a collector or a file, flame
// draws HTML and SVG flame graphs, folded writes folded stacks for flame graph tools.
// For sonde view, pprof, otlp and folded also read their files back, and merge sums and
// filters what they read.
package reporter
