module github.com/sonde-profiler/sonde/test/fidelity

go 1.26.8

replace github.com/sonde-profiler/sonde => ../..

require (
	github.com/google/pprof v0.0.0-20260906184651-6331bc6350fe
	github.com/sonde-profiler/sonde v0.0.0-00010101000000-000000000000
)

require (
	github.com/klauspost/cpuid/v2 v2.0.9 // indirect
	github.com/zeebo/xxh3 v1.0.2 // indirect
	go.opentelemetry.io/proto/otlp v1.11.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)
