package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/cmd/agent/pipeline"
	"github.com/sonde-profiler/sonde/internal/procfs"
	"github.com/sonde-profiler/sonde/reporter/files"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/symbolize"
	"github.com/sonde-profiler/sonde/symbolize/debuginfod"
	"github.com/sonde-profiler/sonde/trace"
)

// usageError marks errors in how sonde was invoked: they exit with status 2.
type usageError struct{ error }

// config is everything the command line and environment decide.
type config = pipeline.Config

// maxFrequency is the highest sampling rate sonde accepts. A sample costs a few µs in the
// kernel and about one in sonde, per CPU: at 10 kHz that is already several percent of
// every CPU, and the kernel throttles perf events well before its own ceiling of 100 kHz.
const maxFrequency = 10000

// DefaultMemoryLimit is what a node agent gets when nothing says otherwise: the budget
// the OpenTelemetry eBPF profiler publishes, which sonde stays well under on its own.
const DefaultMemoryLimit = 256 << 20

// parseConfig reads the agent's flags, the SONDE_* environment, the --config file and the
// OTEL_* environment (through getenv), in that precedence. Both -flag and --flag work, as
// with the standard flag package.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (*config, error) {
	fs, check, err := agentFlags(getenv)
	if err != nil {
		return nil, err
	}
	fs.SetOutput(stderr)
	showVersion := fs.Bool("version", false, "print the version, Go's and what this kernel supports, and exit")
	fs.String("config", "", "read flags from a YAML `FILE` of flag names and values (also SONDE_CONFIG); the command line wins over SONDE_* variables, which win over the file")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sonde [flags]\n\nsonde samples CPU stacks with eBPF and writes profiles.\n\n%s\nEvery flag can also be set in the --config file, under its name, or in the environment\nas SONDE_ and its name in capitals with underscores (SONDE_OTLP_ENDPOINT).\n\nFlags:\n", commandsHelp)
		fs.PrintDefaults()
	}
	layers, err := configLayers(fs, args, getenv)
	if err != nil {
		return nil, usageError{err}
	}
	repeated, err := applyLayers(fs, layers)
	if err != nil {
		return nil, usageError{err}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	if *showVersion {
		return nil, errShowVersion
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	// A repeatable flag from the environment or file counts only when the command line
	// does not give it.
	for name, values := range repeated {
		onCommandLine := false
		fs.Visit(func(f *flag.Flag) { onCommandLine = onCommandLine || f.Name == name })
		for _, v := range values {
			if !onCommandLine {
				if err := fs.Set(name, v); err != nil {
					return nil, usageError{fmt.Errorf("%s: %w", name, err)}
				}
			}
		}
	}
	return check(fs)
}

// agentFlags defines the agent's flags, which the subcommands share where they mean the
// same. check validates what was parsed into the config, set being the flag set that
// parsed it (the agent's, or a subcommand's sharing these flags' values).
func agentFlags(getenv func(string) string) (*flag.FlagSet, func(set *flag.FlagSet) (*config, error), error) {
	c := &config{Version: version}
	var err error
	if c.OTLP, err = otlp.ConfigFromEnv(getenv); err != nil {
		return nil, nil, usageError{err}
	}
	envEndpoint := getenv("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	if c.Debuginfod, err = debuginfod.ConfigFromEnv(getenv); err != nil {
		return nil, nil, usageError{err}
	}
	fs := flag.NewFlagSet("sonde", flag.ContinueOnError)
	var pids, logLevel, memoryLimit string
	var outputs []string
	fs.StringVar(&pids, "pid", "", "profile only these processes (`PID[,PID...]`); filtered in the kernel")
	var children bool
	fs.BoolVar(&children, "children", false, "with --pid, also profile their descendants: those running now and those they start later (php-fpm's, Puma's and gunicorn's workers, as they are recycled)")
	fs.IntVar(&c.Frequency, "frequency", 0, fmt.Sprintf("samples per second per CPU (`HZ`, at most %d) (default 19 host-wide, 199 with --pid)", maxFrequency))
	fs.DurationVar(&c.Duration, "duration", 0, "stop after this long (0: run until SIGINT or SIGTERM)")
	fs.Func("output", "write the whole run, merged, to `FILE` when sonde stops; the name picks the format: "+files.Names+"; may be given more than once", func(s string) error {
		outputs = append(outputs, s)
		return nil
	})
	fs.BoolVar(&c.KernelStacks, "kernel-stacks", true, "record kernel stacks too")
	fs.StringVar(&logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.IntVar(&c.Top, "top", 15, "print the `N` hottest functions at exit (0: none)")
	fs.BoolVar(&c.BPFStats, "bpf-stats", false, "measure the BPF program's run time and report ns per sample at exit")
	var symMode string
	fs.StringVar(&symMode, "symbolize", "full", "naming on the host: `full` (DWARF lines and inlines, Go pclntab, symbol tables), symtab (symbol tables and pclntab), none (addresses and build IDs only)")
	fs.IntVar(&c.Symbolize.FileCacheSize, "symbol-cache-files", symbolize.DefaultFileCacheSize, "parsed object files kept for naming (LRU), at most; their memory is bounded by --memory-limit too")
	fs.IntVar(&c.Symbolize.AddressCacheSize, "symbol-cache-addresses", symbolize.DefaultAddressCacheSize, "named addresses kept (LRU), at most; their memory is bounded by --memory-limit too")
	var debuginfodURLs, debuginfodCacheSize string
	fs.StringVar(&debuginfodURLs, "debuginfod-urls", getenv("DEBUGINFOD_URLS"), "fetch debug files of stripped code by build ID from these debuginfod servers (`URLS`, space-separated; default $DEBUGINFOD_URLS; empty: none), in the background; DEBUGINFOD_TIMEOUT, _MAXTIME, _MAXSIZE and _HEADERS_FILE apply")
	fs.StringVar(&c.Debuginfod.CacheDir, "debuginfod-cache-dir", debuginfod.DefaultCacheDir(getenv), "where fetched debug files are kept (`DIR`; default $DEBUGINFOD_CACHE_PATH, else debuginfod under systemd's $STATE_DIRECTORY, else the user's cache directory)")
	fs.StringVar(&debuginfodCacheSize, "debuginfod-cache-size", "2GiB", "bound of --debuginfod-cache-dir (`SIZE`); the least recently used files are removed past it")
	fs.IntVar(&c.ChunkSize, "chunk-size", trace.DefaultChunkSize, "frames per interned stack chunk; stacks sharing a prefix share its chunks")
	fs.IntVar(&c.ChunkCache, "chunk-cache", 0, "stack chunks kept in the intern cache (LRU) (0: sized from --memory-limit)")
	fs.StringVar(&c.Unwind, "unwind", "tables", "how user stacks are walked: `tables` (.eh_frame, no frame pointers needed; frame pointers where a file has none) or fp (frame pointers only)")
	fs.IntVar(&c.UnwindRows, "unwind-rows", 0, "rows (16 bytes of kernel memory each) all files' unwind tables may hold together; tables of files no process maps are freed to make room (0: sized from --memory-limit)")
	fs.DurationVar(&c.Interval, "interval", 10*time.Second, "how often collected samples are symbolized and sent (±10% jitter)")
	fs.BoolVar(&c.Timestamps, "timestamps", false, "send each sample's time, not only counts per stack")
	fs.BoolVar(&c.OffCPU, "off-cpu", false, "also record where threads wait off the CPU (locks, I/O, sleeps), by stack, weighted by the time waited: a second profile (off_cpu, nanoseconds) beside the CPU one")
	fs.DurationVar(&c.OffCPUMin, "off-cpu-min", bpf.DefaultOffCPUMin, "with --off-cpu, the shortest wait recorded")
	fs.BoolVar(&c.OffCPUGoroutines, "off-cpu-goroutines", false, "with --off-cpu, also record where goroutines wait in Go's scheduler (channels, mutexes, timers, the network), by goroutine stack: uprobes on the profiled Go programs' runtime.gopark and runtime.execute, which cost those programs about a microsecond per goroutine switch")
	fs.IntVar(&c.OffCPURate, "off-cpu-rate", bpf.DefaultOffCPUWalks, "with --off-cpu, the switch-outs each CPU walks per second before it walks a random sample of them, weighted to keep totals right (`N`; 0: every one)")
	var view string
	fs.StringVar(&view, "view", "", "what the flame graph, top table and folded stacks weigh stacks by: `cpu`, off-cpu (time waited) or wall (both, as time) (default cpu; off-cpu with --off-cpu)")
	fs.BoolVar(&c.TraceContext, "trace-context", true, "link samples to the span their thread was in: read OpenTelemetry thread and process contexts (OTEPs 4947, 4719) and Go pprof labels")
	fs.StringVar(&memoryLimit, "memory-limit", "256MiB", "memory sonde may use (`SIZE`, e.g. 128MiB, 1GiB), its own and its BPF maps': caches, queues and maps are sized from it, and under pressure caches and queued intervals are dropped first")
	var endpoint string
	fs.StringVar(&endpoint, "otlp-endpoint", "", "send OTLP profiles over gRPC to this collector (`host:port`, or https://, http://); default from OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT")
	fs.BoolVar(&c.OTLP.Insecure, "otlp-insecure", c.OTLP.Insecure, "send to the collector in plaintext instead of TLS")
	fs.IntVar(&c.OTLP.QueueSize, "otlp-queue", c.OTLP.QueueSize, "intervals kept while the collector is unreachable; beyond this, or beyond their share of --memory-limit, the oldest are dropped")
	var threadAttrs string
	fs.StringVar(&threadAttrs, "thread-attributes", "name", "per-sample thread attributes sent over OTLP: `name`, id, name,id or none (each distinct value can become a series in the backend)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve /healthz and /metrics (Prometheus text) on `ADDR`, e.g. :9464 (empty: none)")
	fs.BoolVar(&c.MetricsOTLP, "metrics-otlp", false, "also push sonde's metrics over OTLP to the collector profiles go to, every --interval")
	var namespaces, selector, cgroups string
	fs.StringVar(&cgroups, "cgroup", "", "profile only processes in these cgroup v2 directories and below them (`PATH[,PATH...]`, relative to --cgroup-root); filtered in the kernel")
	fs.StringVar(&c.Kube.CgroupRoot, "cgroup-root", "", "where the host's cgroup v2 hierarchy is mounted (`DIR`; default: found in /proc/self/mountinfo)")
	fs.StringVar(&c.Kube.NodeName, "k8s-node-name", getenv("NODE_NAME"), "this Kubernetes node's `NAME` (default $NODE_NAME): with it, pods' names, namespaces, containers and workloads are added to their processes' resources")
	fs.BoolVar(&c.Kube.Metadata, "k8s-metadata", true, "ask the API server about this node's pods (needs --k8s-node-name)")
	fs.StringVar(&c.Kube.Kubeconfig, "k8s-kubeconfig", "", "reach the API server as this kubeconfig `FILE`'s current context says (a token, token file or client certificate) instead of the pod's service account: for sonde outside a pod")
	fs.StringVar(&namespaces, "k8s-namespaces", "", "profile only pods in these `NAMESPACES` (comma-separated); filtered in the kernel by the pods' cgroups")
	fs.StringVar(&selector, "k8s-pod-selector", "", "profile only pods whose labels match this `SELECTOR` (a=b,c!=d,e in (f,g)); with --k8s-namespaces a pod must match both")
	check := func(set *flag.FlagSet) (*config, error) {
		if endpoint != "" {
			c.OTLP.Endpoint = endpoint
		}
		c.Export = endpoint != "" || envEndpoint
		if c.Interval < 100*time.Millisecond {
			return nil, usageError{fmt.Errorf("--interval %v: must be at least 100ms", c.Interval)}
		}
		if c.Symbolize.Mode, err = symbolize.ParseMode(symMode); err != nil {
			return nil, usageError{fmt.Errorf("--symbolize: %w", err)}
		}
		if c.Symbolize.FileCacheSize < 1 || c.Symbolize.AddressCacheSize < 0 {
			return nil, usageError{fmt.Errorf("--symbol-cache-files must be positive and --symbol-cache-addresses not negative")}
		}
		c.Debuginfod.URLs = debuginfod.ParseURLs(debuginfodURLs)
		if err := debuginfod.CheckURLs(c.Debuginfod.URLs); err != nil {
			return nil, usageError{fmt.Errorf("--debuginfod-urls: %w", err)}
		}
		if c.Debuginfod.CacheBytes, err = parseSize(debuginfodCacheSize); err != nil || c.Debuginfod.CacheBytes == 0 {
			return nil, usageError{fmt.Errorf("--debuginfod-cache-size %q: want a size such as 2GiB, more than 0", debuginfodCacheSize)}
		}
		if c.ChunkSize < 1 || c.ChunkCache < 0 {
			return nil, usageError{fmt.Errorf("--chunk-size %d must be positive and --chunk-cache %d not negative", c.ChunkSize, c.ChunkCache)}
		}
		if c.Unwind != "tables" && c.Unwind != "fp" {
			return nil, usageError{fmt.Errorf("--unwind %q: want tables or fp", c.Unwind)}
		}
		if c.UnwindRows < 0 {
			return nil, usageError{fmt.Errorf("--unwind-rows %d: must not be negative", c.UnwindRows)}
		}
		if c.OTLP.QueueSize < 1 {
			return nil, usageError{fmt.Errorf("--otlp-queue %d: must be at least 1", c.OTLP.QueueSize)}
		}
		if c.MemoryLimit, err = parseSize(memoryLimit); err != nil {
			return nil, usageError{fmt.Errorf("--memory-limit %q: %w", memoryLimit, err)}
		}
		if c.MemoryLimit < pipeline.MinMemoryLimit {
			return nil, usageError{fmt.Errorf("--memory-limit %s: sonde needs at least %dMiB", memoryLimit, pipeline.MinMemoryLimit>>20)}
		}
		if err := c.LogLevel.UnmarshalText([]byte(logLevel)); err != nil {
			return nil, usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)}
		}
		if c.PIDs, err = parsePIDs(pids); err != nil {
			return nil, usageError{err}
		}
		if children {
			if len(c.PIDs) == 0 {
				return nil, usageError{errors.New("--children follows the processes of --pid: give one")}
			}
			// Those forked from now on the kernel adds to the filter as they start.
			c.FollowForks = true
			c.PIDs = procfs.Descendants("/proc", c.PIDs, bpf.MaxFollowed)
		}
		frequencySet := false
		set.Visit(func(f *flag.Flag) { frequencySet = frequencySet || f.Name == "frequency" })
		if !frequencySet {
			c.Frequency = defaultFrequency(c.PIDs)
		}
		if err := checkFrequency(c.Frequency); err != nil {
			return nil, usageError{err}
		}
		if c.Duration < 0 {
			return nil, usageError{fmt.Errorf("--duration %v: must not be negative", c.Duration)}
		}
		for _, name := range outputs {
			o, err := files.Parse(name)
			if err != nil {
				return nil, usageError{err}
			}
			c.Outputs = append(c.Outputs, o)
		}
		if c.Top < 0 {
			return nil, usageError{fmt.Errorf("--top %d: must not be negative", c.Top)}
		}
		if c.ThreadAttrs, err = parseThreadAttributes(threadAttrs); err != nil {
			return nil, usageError{err}
		}
		if err := pipeline.ParseKube(&c.Kube, namespaces, selector, cgroups); err != nil {
			return nil, usageError{err}
		}
		if c.MetricsOTLP && !c.Export {
			return nil, usageError{errors.New("--metrics-otlp: no collector to push to; set --otlp-endpoint")}
		}
		if c.OffCPUMin < 0 || c.OffCPURate < 0 {
			return nil, usageError{fmt.Errorf("--off-cpu-min %v and --off-cpu-rate %d must not be negative", c.OffCPUMin, c.OffCPURate)}
		}
		if c.View, err = parseView(view, c.OffCPU); err != nil {
			return nil, usageError{err}
		}
		return c, nil
	}
	return fs, check, nil
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

// checkFrequency refuses rates above sonde's ceiling or the kernel's, before anything is
// loaded.
// parseView reads --view; without one, a run recording off-CPU time shows it.
func parseView(s string, offCPU bool) (trace.View, error) {
	switch s {
	case "":
		if offCPU {
			return trace.ViewOffCPU, nil
		}
		return trace.ViewCPU, nil
	case "cpu":
		return trace.ViewCPU, nil
	case "off-cpu":
		if !offCPU {
			return 0, errors.New("--view off-cpu: no off-CPU samples (record with --off-cpu)")
		}
		return trace.ViewOffCPU, nil
	case "wall":
		if !offCPU {
			return 0, errors.New("--view wall: no off-CPU samples (record with --off-cpu)")
		}
		return trace.ViewWall, nil
	}
	return 0, fmt.Errorf("--view %q: want cpu, off-cpu or wall", s)
}

func checkFrequency(hz int) error {
	limit := maxFrequency
	if b, err := os.ReadFile("/proc/sys/kernel/perf_event_max_sample_rate"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v < limit {
			limit = v
		}
	}
	if hz < 1 || hz > limit {
		return fmt.Errorf("--frequency %d: must be between 1 and %d Hz (sonde's ceiling is %d, the kernel's kernel.perf_event_max_sample_rate may be lower)", hz, limit, maxFrequency)
	}
	return nil
}

// parseSize reads a byte count: a number with an optional unit (B, KiB, MiB, GiB, and
// their decimal KB, MB, GB).
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		scale  int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"B", 1}}
	scale := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, scale = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.scale
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/scale {
		return 0, errors.New("want a size such as 256MiB or 1GiB")
	}
	return n * scale, nil
}

func parseThreadAttributes(s string) (otlp.ThreadAttributes, error) {
	if strings.TrimSpace(s) == "none" {
		return otlp.ThreadNone, nil
	}
	var out otlp.ThreadAttributes
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimSpace(f) {
		case "name":
			out |= otlp.ThreadName
		case "id":
			out |= otlp.ThreadID
		default:
			return 0, fmt.Errorf("--thread-attributes %q: want name, id, name,id or none", s)
		}
	}
	return out, nil
}
