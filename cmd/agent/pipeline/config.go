package pipeline

import (
	"log/slog"
	"time"

	"github.com/sonde-profiler/sonde/reporter/files"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/symbolize"
	"github.com/sonde-profiler/sonde/symbolize/debuginfod"
	"github.com/sonde-profiler/sonde/trace"
)

// Config is everything the command line and environment decide: cmd/agent's flags fill it,
// and the pipeline is built from it.
type Config struct {
	PIDs         []uint32
	Frequency    int
	Duration     time.Duration
	Outputs      []files.Output
	KernelStacks bool
	LogLevel     slog.Level
	Top          int
	BPFStats     bool
	Symbolize    symbolize.Options
	ChunkSize    int
	ChunkCache   int
	Unwind       string // "tables" or "fp"
	UnwindRows   int
	Interval     time.Duration
	Timestamps   bool
	// OffCPU records where threads wait too; View is what local outputs weigh stacks by.
	OffCPU     bool
	OffCPUMin  time.Duration
	OffCPURate int
	// OffCPUGoroutines adds goroutines' waits in Go's scheduler, by uprobes on Go binaries.
	OffCPUGoroutines bool
	View             trace.View
	TraceContext     bool
	MemoryLimit      int64
	MetricsAddr      string
	MetricsOTLP      bool
	ThreadAttrs      otlp.ThreadAttributes
	Kube             KubeConfig
	// FollowForks profiles the children of PIDs too, from their fork on (sonde record,
	// --children).
	FollowForks bool
	// Export is set when profiles go to a collector: --otlp-endpoint or the OTEL_* variables name one.
	Export bool
	OTLP   otlp.Config
	// Debuginfod is where debug files not on the host come from; no URLs: nowhere.
	Debuginfod debuginfod.Config
	// Version is sonde's, for the outputs and the collector.
	Version string
}
