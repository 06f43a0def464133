// Package reporter is the last stage: its sub-packages turn flushed profiles into what
// people and backends read. pprof writes gzip pprof files, top prints the terminal summary,
// otlp encodes OpenTelemetry profiles and delivers them to a collector or a file.
package reporter
