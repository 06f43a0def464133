// Package otlp turns sonde's profiles into OpenTelemetry OTLP profiles and delivers
// them: to a collector over gRPC, or to a file.
//
// The wire format is the v1development profiles protocol (go.opentelemetry.io/proto
// v1.11): every request carries one ProfilesDictionary that all its profiles index
// into. Encode builds such requests, one ResourceProfiles per process; Split keeps each
// under the 4 MiB a collector accepts by default; an Exporter queues requests and
// sends them, riding out collector outages with a bounded queue that drops the oldest
// interval; WriteFile stores a request as OTLP protobuf or OTLP/JSON. ReadFile, Decode
// and DecodeFile turn such files back into sonde's profiles, for sonde view, and
// DecodeFile every file the Collector's file exporter writes too.
package otlp
