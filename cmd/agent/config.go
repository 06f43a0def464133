package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/symbolize"
	"github.com/sonde-profiler/sonde/trace"
)

// usageError marks errors in how sonde was invoked: they exit with status 2.
type usageError struct{ error }

// config is everything the command line and environment decide.
type config struct {
	pids         []uint32
	frequency    int
	duration     time.Duration
	output       string
	kernelStacks bool
	logLevel     slog.Level
	top          int
	bpfStats     bool
	symbolize    symbolize.Options
	chunkSize    int
	chunkCache   int
	unwind       string // "tables" or "fp"
	unwindRows   int
	interval     time.Duration
	timestamps   bool
	// export is set when profiles go to a collector: --otlp-endpoint or the OTEL_* variables name one.
	export bool
	otlp   otlp.Config
}

// outputFormat is how --output is written, chosen by its name.
type outputFormat int

const (
	formatPprof outputFormat = iota + 1
	formatOTLP
)

func (c *config) outputFormat() (outputFormat, error) {
	name := strings.ToLower(c.output)
	switch {
	case strings.HasSuffix(name, ".otlp.pb"), strings.HasSuffix(name, ".otlp.json"):
		return formatOTLP, nil
	case strings.HasSuffix(name, ".pb.gz"), strings.HasSuffix(name, ".pprof"):
		return formatPprof, nil
	default:
		return 0, fmt.Errorf("--output %s: unknown format; name it *.pb.gz or *.pprof (gzip pprof), *.otlp.pb or *.otlp.json (OTLP profiles)", c.output)
	}
}

// parseConfig reads flags and the OTEL_* environment (through getenv); flags win. Both
// -flag and --flag work, as with the standard flag package.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (*config, error) {
	c := &config{}
	var err error
	if c.otlp, err = otlp.ConfigFromEnv(getenv); err != nil {
		return nil, usageError{err}
	}
	envEndpoint := getenv("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	fs := flag.NewFlagSet("sonde", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var pids, logLevel string
	fs.StringVar(&pids, "pid", "", "profile only these processes (`PID[,PID...]`); filtered in the kernel")
	fs.IntVar(&c.frequency, "frequency", 0, "samples per second per CPU (`HZ`) (default 19 host-wide, 199 with --pid)")
	fs.DurationVar(&c.duration, "duration", 0, "stop after this long (0: run until SIGINT or SIGTERM)")
	fs.StringVar(&c.output, "output", "", "write the whole run to `FILE` when sonde stops: .pb.gz or .pprof (gzip pprof), .otlp.pb or .otlp.json (OTLP profiles)")
	fs.BoolVar(&c.kernelStacks, "kernel-stacks", true, "record kernel stacks too")
	fs.StringVar(&logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.IntVar(&c.top, "top", 15, "print the `N` hottest functions at exit (0: none)")
	fs.BoolVar(&c.bpfStats, "bpf-stats", false, "measure the BPF program's run time and report ns per sample at exit")
	var symMode string
	fs.StringVar(&symMode, "symbolize", "full", "naming on the host: `full` (DWARF lines and inlines, Go pclntab, symbol tables), symtab (symbol tables and pclntab), none (addresses and build IDs only)")
	fs.IntVar(&c.symbolize.FileCacheSize, "symbol-cache-files", 128, "parsed object files kept for naming (LRU)")
	fs.IntVar(&c.symbolize.AddressCacheSize, "symbol-cache-addresses", 65536, "named addresses kept (LRU)")
	fs.IntVar(&c.chunkSize, "chunk-size", trace.DefaultChunkSize, "frames per interned stack chunk; stacks sharing a prefix share its chunks")
	fs.IntVar(&c.chunkCache, "chunk-cache", trace.DefaultChunkCapacity, "stack chunks kept in the intern cache (LRU)")
	fs.StringVar(&c.unwind, "unwind", "tables", "how user stacks are walked: `tables` (.eh_frame, no frame pointers needed; frame pointers where a file has none) or fp (frame pointers only)")
	fs.IntVar(&c.unwindRows, "unwind-rows", 0, "capacity of the kernel's unwind tables, in rows (12 bytes each) over all files (0: sized from the files the profiled processes map)")
	fs.DurationVar(&c.interval, "interval", 10*time.Second, "how often collected samples are symbolized and sent (±10% jitter)")
	fs.BoolVar(&c.timestamps, "timestamps", false, "send each sample's time, not only counts per stack")
	var endpoint string
	fs.StringVar(&endpoint, "otlp-endpoint", "", "send OTLP profiles over gRPC to this collector (`host:port`, or https://, http://); default from OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT")
	fs.BoolVar(&c.otlp.Insecure, "otlp-insecure", c.otlp.Insecure, "send to the collector in plaintext instead of TLS")
	fs.IntVar(&c.otlp.QueueSize, "otlp-queue", c.otlp.QueueSize, "intervals kept while the collector is unreachable; beyond this the oldest are dropped")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sonde [flags]\n\nsonde samples CPU stacks with eBPF and writes profiles.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if endpoint != "" {
		c.otlp.Endpoint = endpoint
	}
	c.export = endpoint != "" || envEndpoint
	if c.interval < 100*time.Millisecond {
		return nil, usageError{fmt.Errorf("--interval %v: must be at least 100ms", c.interval)}
	}
	if c.symbolize.Mode, err = symbolize.ParseMode(symMode); err != nil {
		return nil, usageError{fmt.Errorf("--symbolize: %w", err)}
	}
	if c.symbolize.FileCacheSize < 1 || c.symbolize.AddressCacheSize < 0 {
		return nil, usageError{fmt.Errorf("--symbol-cache-files must be positive and --symbol-cache-addresses not negative")}
	}
	if c.chunkSize < 1 || c.chunkCache < 1 {
		return nil, usageError{fmt.Errorf("--chunk-size %d and --chunk-cache %d must be positive", c.chunkSize, c.chunkCache)}
	}
	if c.unwind != "tables" && c.unwind != "fp" {
		return nil, usageError{fmt.Errorf("--unwind %q: want tables or fp", c.unwind)}
	}
	if c.unwindRows < 0 {
		return nil, usageError{fmt.Errorf("--unwind-rows %d: must not be negative", c.unwindRows)}
	}
	if c.otlp.QueueSize < 1 {
		return nil, usageError{fmt.Errorf("--otlp-queue %d: must be at least 1", c.otlp.QueueSize)}
	}
	if err := c.logLevel.UnmarshalText([]byte(logLevel)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)}
	}
	if c.pids, err = parsePIDs(pids); err != nil {
		return nil, usageError{err}
	}
	frequencySet := false
	fs.Visit(func(f *flag.Flag) { frequencySet = frequencySet || f.Name == "frequency" })
	if !frequencySet {
		c.frequency = defaultFrequency(c.pids)
	}
	if err := checkFrequency(c.frequency); err != nil {
		return nil, usageError{err}
	}
	if c.duration < 0 {
		return nil, usageError{fmt.Errorf("--duration %v: must not be negative", c.duration)}
	}
	if c.output != "" {
		if _, err := c.outputFormat(); err != nil {
			return nil, usageError{err}
		}
	}
	if c.top < 0 {
		return nil, usageError{fmt.Errorf("--top %d: must not be negative", c.top)}
	}
	return c, nil
}

// Host-wide, sonde runs all the time and 19 Hz keeps it cheap while a fleet adds up to
// plenty of samples. A look at one process lasts seconds: shares read from n samples are
// off by about sqrt(p(1-p)/n), so five seconds at 19 Hz (95 samples) misread a 60 % share
// by ±5 points, at 199 Hz (about 1000 samples) by ±1.5. The kernel's PID filter keeps
// the higher rate nearly free for every other process.
const (
	hostFrequency   = 19
	targetFrequency = 199
)

func defaultFrequency(pids []uint32) int {
	if len(pids) > 0 {
		return targetFrequency
	}
	return hostFrequency
}

func parsePIDs(s string) ([]uint32, error) {
	if s == "" {
		return nil, nil
	}
	var pids []uint32
	for _, field := range strings.Split(s, ",") {
		pid, err := strconv.ParseUint(strings.TrimSpace(field), 10, 32)
		if err != nil || pid == 0 {
			return nil, fmt.Errorf("--pid %q: %q is not a process ID", s, field)
		}
		pids = append(pids, uint32(pid))
	}
	return pids, nil
}

// checkFrequency refuses rates the kernel would refuse, before anything is loaded.
func checkFrequency(hz int) error {
	limit := 100000
	if b, err := os.ReadFile("/proc/sys/kernel/perf_event_max_sample_rate"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			limit = v
		}
	}
	if hz < 1 || hz > limit {
		return fmt.Errorf("--frequency %d: must be between 1 and %d Hz (kernel.perf_event_max_sample_rate)", hz, limit)
	}
	return nil
}

// checkPIDsExist fails fast on a --pid that names no running process.
func checkPIDsExist(pids []uint32) error {
	for _, pid := range pids {
		if _, err := os.Stat(filepath.Join("/proc", strconv.FormatUint(uint64(pid), 10))); err != nil {
			return fmt.Errorf("--pid %d: no such process", pid)
		}
	}
	return nil
}
