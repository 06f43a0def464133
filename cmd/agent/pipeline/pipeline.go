package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/internal/kube"
	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/reporter/files"
	"github.com/sonde-profiler/sonde/reporter/merge"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/reporter/top"
	"github.com/sonde-profiler/sonde/symbolize"
	"github.com/sonde-profiler/sonde/symbolize/debuginfod"
	"github.com/sonde-profiler/sonde/trace"
	"github.com/sonde-profiler/sonde/unwind"

	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

// Bounds of shutdown: however a stage or a file behaves, sonde exits within a few seconds
// of its last interval, plus the exporter's own timeout to deliver what is queued.
const (
	stageStopTimeout = 2 * time.Second
	primeTimeout     = 5 * time.Second
)

// chunkIdle is how long the aggregator keeps the stack chunks no interval reported (and
// the V8 namer what no stack showed: interp/node's DefaultMaxIdle): long enough that
// stacks seen every few intervals stay resolved, short enough that what code compiled
// without end holds has settled within the first minute. At a minute it settled after
// the first few: a Node.js program compiling new functions had sonde's live heap at 16
// MiB after one minute and 23 MiB after four and a half; at 30 s, 17 MiB after one
// minute and after five and a half.
const chunkIdle = 30 * time.Second

// Pipeline is sonde's stages, wired: the sampler feeds the aggregator and the process
// tracker; the tracker feeds the unwind table maintainer; every interval the aggregator's
// profile is symbolized and handed to the sinks.
type Pipeline struct {
	// vmas is reused for the kernel's naming of a sample's mappings (ring reader only).
	vmas []trace.SampledMapping
	// The ring reader's too: when Polled last checked, and its watch of the ring.
	watchedAt  time.Time
	ringWatch  ringWatch
	tally      *tally // the end a person on a terminal reads; nil elsewhere
	cfg        *Config
	log        *slog.Logger
	budget     budget
	sampler    *bpf.Sampler
	procs      *trace.Processes
	agg        *trace.Aggregator
	tables     *unwind.Maintainer  // nil when walking by frame pointer
	runtimes   []registeredRuntime // none when walking by frame pointer
	symbolizer *symbolize.Symbolizer
	debuginfod *debuginfod.Client // nil without --debuginfod-urls
	exporter   *otlp.Exporter
	sinks      []Sink
	pressure   *pressure
	trim       *heapTrimmer // gives the heap back at intervals' ends
	period     time.Duration
	runStart   time.Time
	resource   otlp.Resource
	encode     otlp.EncodeOptions
	targets    *targets
	health     *health
	telemetry  *telemetry    // nil without --metrics-addr
	watcher    *kube.Watcher // nil outside Kubernetes or without API access
	pods       *podFilter    // nil without --k8s-namespaces and --k8s-pod-selector
	// symStats is the symbolizer's counters as of the last interval: the symbolizer
	// holds its lock while it names an interval, which /metrics must not wait for.
	symStats atomic.Pointer[symbolize.Stats]

	// Set by subcommands between build and run.
	quiet   bool   // no progress line: a live view or a recorded program owns the terminal
	started func() // called once sampling runs: sonde record lets its program start
}

// Quiet keeps the progress line off: a live view or a recorded program owns the terminal.
func (p *Pipeline) Quiet() { p.quiet = true }

// OnStarted has f called once sampling runs: sonde record lets its program start then.
func (p *Pipeline) OnStarted(f func()) { p.started = f }

// EndByContext makes the run end when its context does, not when its targets exit: a
// recorded program's end is its wait status, not the kernel's exit event, which also fires
// when a thread execs and the old leader thread dies while the process lives on.
func (p *Pipeline) EndByContext() { p.targets = newTargets(nil) }

// TopTo sends the top table to w instead of standard output.
func (p *Pipeline) TopTo(w io.Writer) {
	for _, s := range p.sinks {
		if t, ok := s.(*topSink); ok {
			t.out = w
		}
	}
}

// AddSink hands every interval to s too.
func (p *Pipeline) AddSink(s Sink) { p.sinks = append(p.sinks, s) }

// LostSamples is how many samples the kernel dropped for a full ring buffer so far.
func (p *Pipeline) LostSamples() uint64 {
	c, _ := p.sampler.Counters()
	return c.RingBufferFull
}

// Close unloads the kernel's programs.
func (p *Pipeline) Close() { p.sampler.Close() }

// Run samples until ctx ends, --duration passes or every --pid target exits. Every
// interval it symbolizes what was collected and hands it to the sinks.
func Run(ctx context.Context, cfg *Config, log *slog.Logger) error {
	p, err := Build(cfg, log)
	if err != nil {
		return err
	}
	defer p.sampler.Close()
	return p.Run(ctx)
}

// UsageError marks errors in how sonde was invoked, found as the pipeline is built: they
// exit with status 2.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// checkPIDsExist fails for a --pid no process has.
func checkPIDsExist(pids []uint32) error {
	for _, pid := range pids {
		if _, err := os.Stat(filepath.Join("/proc", strconv.FormatUint(uint64(pid), 10))); err != nil {
			return fmt.Errorf("--pid %d: no such process", pid)
		}
	}
	return nil
}

// closers undoes what build made, the last made first, should a later stage fail: each
// stage that holds something (a connection, the kernel's programs, a listener) pushes its
// undoing as it is made, so that no failure below it can leave it open.
type closers []func()

func (c *closers) push(f func()) { *c = append(*c, f) }

func (c closers) close() {
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

// Build checks what can be checked, loads the kernel programs and makes every stage; it
// starts nothing.
func Build(cfg *Config, log *slog.Logger) (_ *Pipeline, err error) {
	var undo closers
	defer func() {
		if err != nil {
			undo.close()
		}
	}()
	if err := checkPIDsExist(cfg.PIDs); err != nil {
		return nil, UsageError{err}
	}
	if err := checkCapabilities(log); err != nil {
		return nil, err
	}
	cpus, err := bpf.OnlineCPUs()
	if err != nil {
		return nil, err
	}
	p := &Pipeline{cfg: cfg, log: log, budget: newBudget(cfg.MemoryLimit, cfg, len(cpus)), period: time.Second / time.Duration(cfg.Frequency)}
	debug.SetMemoryLimit(p.budget.goLimit)
	if os.Getenv("GOGC") == "" {
		// A node is provisioned for the agent's peak, and sonde's heap is mostly caches
		// with a burst at each interval's naming: a collection at 1.5 times the live heap
		// rather than twice keeps the peak about 15 MB lower during a toolchain build,
		// for GC work that stays a small part of a core.
		debug.SetGCPercent(50)
	}
	setProcs(cfg, len(cpus))
	p.resource, err = otlp.ResourceFromEnv(os.Getenv)
	if err != nil {
		log.Warn("resource attributes from the environment ignored", "err", err)
	}
	p.encode = otlp.EncodeOptions{Version: cfg.Version, Timestamps: cfg.Timestamps, ThreadAttributes: cfg.ThreadAttrs}
	if cfg.Export {
		ocfg := cfg.OTLP
		ocfg.QueueBytes = p.budget.queueBytes
		// However long the collector was away, it gets the queue within an interval of
		// its return: retries never wait longer than that.
		if ocfg.RetryMax == 0 || ocfg.RetryMax > cfg.Interval {
			ocfg.RetryMax = max(cfg.Interval, time.Second)
		}
		if p.exporter, err = otlp.New(ocfg, otlp.WithLogger(log), otlp.WithResource(p.resource), otlp.WithEncodeOptions(p.encode)); err != nil {
			return nil, UsageError{err}
		}
		undo.push(func() { p.exporter.Close() })
	}
	cgroupIDs, err := cgroupIDs(&cfg.Kube)
	if err != nil {
		return nil, UsageError{err}
	}
	if cfg.OffCPU && cfg.OffCPUGoroutines {
		if caps, err := effectiveCaps(); err == nil && caps&(1<<unix.CAP_SYS_ADMIN) == 0 {
			return nil, errors.New("--off-cpu-goroutines needs CAP_SYS_ADMIN: the kernel lets only it put uprobes on programs (the deployed capabilities leave it out; run without the flag, or as root)")
		}
	}
	bcfg := bpf.Config{
		PIDs:                 cfg.PIDs,
		Cgroups:              cgroupIDs,
		CgroupFilter:         cfg.Kube.FilterByPod,
		MaxCgroups:           maxFilteredPods,
		Frequency:            cfg.Frequency,
		KernelStacks:         cfg.KernelStacks,
		CollectStats:         cfg.BPFStats,
		FramePointersOnly:    cfg.Unwind == "fp",
		MaxProcesses:         p.budget.maxProcesses,
		RingBufferBytes:      p.budget.ringBytes,
		FollowForks:          cfg.FollowForks,
		LazyProcessEvents:    execGrace(cfg) > 0,
		OffCPU:               cfg.OffCPU,
		OffCPUMin:            cfg.OffCPUMin,
		OffCPUWalksPerSecond: offCPUWalks(cfg.OffCPURate),
		OffCPUGoroutines:     cfg.OffCPUGoroutines,
		Runtimes:             kernelMaps(runtimeSpecs),
	}
	if cfg.Unwind == "tables" && !bcfg.TableUnwinding() {
		log.Info("unwind tables are not supported on this architecture yet; user stacks are walked by frame pointer")
	}
	// Loading the programs decodes the kernel's BTF and verifies them: a burst of heap
	// on top of what every package's initialisation made resident of the executable.
	// Giving back the one before and the other after keeps start-up's peak to the
	// larger of the two rather than their sum.
	if _, err := releaseOwnCode(false); err != nil {
		log.Debug("cannot release own code pages", "err", err)
	}
	if p.sampler, err = bpf.Load(bcfg); err != nil {
		return nil, err
	}
	undo.push(func() { p.sampler.Close() })
	debug.FreeOSMemory()
	var observer trace.MappingObserver
	if bcfg.TableUnwinding() {
		p.tables = unwind.NewMaintainer(unwind.MaintainerConfig{
			Kernel:      kernelTables{p.sampler},
			MaxMappings: bpf.MaxProcessMappings,
			MaxRows:     p.budget.unwindRows,
			OnError: func(what string, err error) {
				log.Info("no unwind table; frames there are walked by frame pointer", "file", what, "err", err)
			},
			Read:             freeLargeTables,
			Goroutines:       goroutineProbes(p.sampler, cfg, log),
			FramePointerCode: framePointerCode(runtimeSpecs),
		})
		// Language runtimes' frames are walked in the kernel beside the native ones, which
		// the table walker finds the runtime's code among. The aggregator exists before
		// any runtime's reader runs.
		if p.runtimes, err = newRuntimes(runtimeSpecs, p.sampler, func(pid uint32, image uint64) { p.agg.RenewImage(pid, image) }, p.budget, log); err != nil {
			return nil, err
		}
		observers := trace.MappingObservers{p.tables}
		for _, r := range p.runtimes {
			observers = append(observers, r.rt)
		}
		observer = observers
	}
	// Every runtime is registered: the program's BTF, which only their layout checks
	// read, can go.
	p.sampler.SealRuntimes()
	if p.watcher, err = newWatcher(cfg, log); err != nil {
		return nil, err
	}
	var contexts trace.ContextObserver
	if cfg.TraceContext {
		contexts = kernelContexts{p.sampler}
	}
	p.procs = trace.NewProcesses(trace.ProcessConfig{
		Describer: describer{watcher: p.watcher, runtimes: describers(p.runtimes)},
		OnFileError: func(path string, err error) {
			log.Info("cannot identify mapped file; its frames keep addresses only", "file", path, "err", err)
		},
		Observer:     observer,
		Contexts:     contexts,
		ExecIDs:      p.sampler,
		Pinned:       cfg.PIDs,
		MaxProcesses: p.budget.maxProcesses,
		// As long as the chunks of its stacks stay: beside the side-by-side workloads, the
		// collector, the peer, the shell and sonde itself, each sampled every few
		// intervals, had their mappings read and sent to the kernel again each time.
		IdleFor: chunkIdle,
		// Host-wide, most execs are of programs that end in a few milliseconds, which a
		// sample rarely meets: read after a grace, if still there (sampled first, at their
		// first sample). A run of named targets and their children reads at once.
		ExecGrace: execGrace(cfg),
	})
	kernel, err := trace.KernelMapping("/sys/kernel/notes")
	if err != nil {
		log.Debug("kernel build id unavailable", "err", err)
	}
	p.runStart = time.Now().Round(0)
	if p.agg, err = trace.NewAggregator(trace.Config{
		Period:         p.period,
		Kernel:         kernel,
		KeepTimestamps: cfg.Timestamps,
		ChunkSize:      cfg.ChunkSize,
		ChunkCapacity:  p.budget.chunkCache,
		MaxLocations:   p.budget.locations,
		MaxIdle:        chunkIdle,
		Runtimes:       p.frameDecoders(),
	}, p.procs, p.runStart); err != nil {
		return nil, UsageError{err}
	}
	symOpts := cfg.Symbolize
	symOpts.FileCacheBytes = p.budget.fileCacheBytes
	symOpts.DWARFCacheBytes = p.budget.dwarfCacheBytes
	symOpts.MaxDecompressedBytes = p.budget.decompressedBytes
	symOpts.AddressCacheBytes = p.budget.addressCacheBytes
	symOpts.Runtimes = p.namers()
	if p.debuginfod = newDebuginfod(cfg.Debuginfod, log); p.debuginfod != nil {
		symOpts.DebugFetcher = p.debuginfod
	}
	p.symbolizer = symbolize.New(symOpts)
	p.sinks = p.makeSinks()
	if term.IsTerminal(int(os.Stderr.Fd())) {
		// A person reads the end: a few lines rather than the summary's counters.
		p.tally = newTally()
		p.sinks = append(p.sinks, p.tally)
	}
	p.pressure = &pressure{limit: p.budget.rss, log: log, sheds: p.shedders()}
	p.trim = newHeapTrimmer()
	p.ringWatch = ringWatch{sampler: p.sampler, log: log}
	p.targets = newTargets(cfg.PIDs)
	p.health = &health{sampler: p.sampler}
	if cfg.MetricsAddr != "" {
		if p.telemetry, err = newTelemetry(p, p.health); err != nil {
			return nil, err
		}
		undo.push(func() { p.telemetry.listener.Close(); p.telemetry.close() })
	}
	return p, nil
}

// makeSinks lists where intervals go: the collector, the output files, the top table.
func (p *Pipeline) makeSinks() []Sink {
	var sinks []Sink
	if p.exporter != nil {
		sinks = append(sinks, newExportSink(p.exporter, p.log))
	}
	if len(p.cfg.Outputs) > 0 {
		sinks = append(sinks, &fileSink{
			outputs:  p.cfg.Outputs,
			merged:   merge.NewMerger(p.budget.mergedStacks),
			facts:    p.facts,
			log:      p.log,
			start:    p.runStart,
			period:   p.period,
			hostWide: p.cfg.hostWide(),
			view:     p.cfg.View,
		})
	}
	if p.cfg.Top > 0 {
		table := top.NewTable()
		table.Time = files.ViewTime(p.cfg.View)
		sinks = append(sinks, &topSink{table: table, n: p.cfg.Top, out: os.Stdout, hostWide: p.cfg.hostWide(), view: p.cfg.View})
	}
	return sinks
}

// shedders lists what can give memory back, least valuable first: names are read again
// from files when needed, intervals queued for an absent collector are lost.
func (p *Pipeline) shedders() []func() {
	s := []func(){func() { p.symbolizer.Shed() }}
	if p.exporter != nil {
		s = append(s, func() { p.exporter.Shed() })
	}
	return s
}

// facts describes the run for the outputs.
func (p *Pipeline) facts() files.Facts {
	f := files.Facts{Resource: p.resource, Encode: p.encode, Frequency: p.cfg.Frequency, Command: os.Args, LostSamples: -1}
	if c, err := p.sampler.Counters(); err == nil {
		f.LostSamples = int64(c.RingBufferFull)
	}
	return f
}

// Run starts the stages, runs the interval loop until sampling ends, and shuts down.
func (p *Pipeline) Run(ctx context.Context) error {
	// Stages that serve the sampler run until shutdown tells them to stop.
	stageCtx, stopStages := context.WithCancel(context.Background())
	defer stopStages()
	var stages sync.WaitGroup
	stages.Go(func() { p.procs.Run(stageCtx) })
	if p.tables != nil {
		stages.Go(func() { p.tables.Run(stageCtx) })
	}
	for _, r := range p.runtimes {
		stages.Go(func() { r.rt.Run(stageCtx) })
	}
	if p.debuginfod != nil {
		stages.Go(func() { p.debuginfod.Run(stageCtx) })
	}
	if p.telemetry != nil {
		p.telemetry.serve(p.log)
		defer p.telemetry.close()
	}
	p.startWatcher(stageCtx, &stages)
	p.prime()
	if p.cfg.KernelStacks {
		// Before sampling starts, while sonde's memory is at its lowest.
		if err := p.symbolizer.PrepareKernel(); err != nil {
			p.log.Info("cannot symbolize; frames keep addresses and build ids", "err", err)
		}
	}
	if err := p.sampler.Start(); err != nil {
		return err
	}
	p.health.started.Store(true)
	// Start-up is over: what every package's initialisation touched of the executable
	// goes before the first interval's naming adds its own peak. Again after the first
	// interval, for what building the first tables and naming used once, and from then
	// on only what the run touches comes back (see releaseOwnCode). Not after every
	// interval: an interval's work would fault its pages back in each time.
	p.releaseOwnCode(false)
	if p.started != nil {
		p.started()
	}
	p.log.Info("sampling", "frequency_hz", p.cfg.Frequency, "pids", p.cfg.PIDs, "duration", p.cfg.Duration,
		"otlp_endpoint", p.exportTarget(), "interval", p.cfg.Interval, "memory", p.budget, "version", p.cfg.Version)

	if p.cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.Duration)
		defer cancel()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.targets.onAllExited = func() {
		p.log.Info("every target process exited; stopping")
		cancel()
	}
	sampled := make(chan error, 1)
	go func() { sampled <- p.sampler.Run(ctx, p) }()

	stopProgress := p.showProgress()
	runErr := p.loop(sampled)
	p.pressure.statm.close() // the reader, its only user, has returned
	p.health.stopped.Store(true)
	cancel()
	stopProgress()
	if runErr != nil {
		p.log.Error("sampling stopped early; reporting what was collected", "err", runErr)
	}
	// An overflow whose drain the stop cut short was never seen by a poll: told now.
	p.ringWatch.check()
	last := p.agg.Flush(time.Now())
	p.name(last)
	if p.awaitDebugFiles() {
		p.name(last) // the files whose debug files came are read again with them
	}
	p.send(last)
	stopStages()
	waitBounded(&stages, stageStopTimeout)
	err := p.closeSinks()
	if p.tally != nil && !p.quiet {
		// On a terminal the counters go to the debug log; a person reads a few lines.
		p.logSummary(slog.LevelDebug)
		if perr := p.tally.print(Stderr, time.Since(p.runStart), p.LostSamples()); perr != nil {
			err = errors.Join(err, perr)
		}
	} else {
		p.logSummary(slog.LevelInfo)
	}
	return errors.Join(runErr, err)
}

// largeTableRows is where the rows a process's new tables read (24 bytes each in the
// heap, and their encoding for the kernel) are worth a collection of their own once
// written.
const largeTableRows = 1 << 14

// freeLargeTables gives the memory of large tables' rows back at once. Node's
// executable has 550 000 rows: 13 MB that, with the heap's goal raised by them, stayed
// until the first naming pass allocated on top of them (peak 62 MB beside a busy Node.js;
// measured 2026-11-26). A CPython starting (libpython has 64 000 rows) added 3.6 MB to
// sonde's resident set that stayed for seconds, then half of it for a minute; with the
// collection, it is gone 0.4 s after the exec (measured 2026-11-27, 131 072 rows the
// bound before). A collection and the return of its pages cost a few milliseconds, once
// per process whose files are new. Since 78999d0 a table read from .eh_frame is never
// whole in memory: it is counted, then built again a part of at most 4 096 rows at a
// time as the kernel takes it, its FDEs read from the sorted table one at a time. What it
// leaves on the heap is its part's buffers, or its list of FDEs where the file has no
// sound sorted table; a Go binary's rows are still built there whole.
func freeLargeTables(rows int) {
	if rows >= largeTableRows {
		debug.FreeOSMemory()
	}
}

// prime reads the mappings of the targets named in advance, and builds their unwind
// tables, before sampling starts: their first samples are walked with tables.
func (p *Pipeline) prime() {
	if len(p.cfg.PIDs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), primeTimeout)
	defer cancel()
	for _, pid := range p.cfg.PIDs {
		p.procs.Prime(pid)
	}
	p.procs.Settle(ctx)
	if p.tables != nil {
		p.tables.Settle(ctx)
	}
}

// loop flushes an interval every --interval until sampling ends.
func (p *Pipeline) loop(sampled <-chan error) error {
	timer := time.NewTimer(jittered(p.cfg.Interval))
	defer timer.Stop()
	var own ownPages
	for {
		select {
		case <-timer.C:
			now := time.Now()
			prof := p.agg.Flush(now)
			p.name(prof)
			switch own.intervalEnd(now) {
			case ownRelease:
				p.releaseOwnCode(true)
			case ownDropCache:
				if err := dropOwnCache(); err != nil {
					p.log.Debug("cannot drop own cached pages", "err", err)
				}
			}
			p.send(prof)
			p.trim.intervalDone(now)
			timer.Reset(jittered(p.cfg.Interval))
		case err := <-sampled:
			return err
		}
	}
}

func (p *Pipeline) releaseOwnCode(exact bool) {
	if _, err := releaseOwnCode(exact); err != nil {
		p.log.Debug("cannot release own code pages", "err", err)
	}
}

// name names an interval's locations.
func (p *Pipeline) name(prof *trace.Profile) {
	if len(prof.Samples) > 0 {
		for _, err := range p.symbolizer.Symbolize(prof) {
			p.log.Info("cannot symbolize; frames keep addresses and build ids", "err", err)
		}
		st := p.symbolizer.Stats()
		p.symStats.Store(&st)
	}
}

// send hands a named interval to every sink.
func (p *Pipeline) send(prof *trace.Profile) {
	for _, s := range p.sinks {
		s.Add(prof)
	}
}

func (p *Pipeline) closeSinks() error {
	var errs []error
	for _, s := range p.sinks {
		if err := s.Close(context.Background()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// HandleSample feeds a kernel sample to the aggregator; it implements bpf.Handler, on the
// goroutine that drains the ring buffer.
func (p *Pipeline) HandleSample(b *bpf.Sample) {
	var mappings []trace.SampledMapping
	if len(b.VMAs) > 0 {
		p.vmas = p.vmas[:0]
		for _, v := range b.VMAs {
			p.vmas = append(p.vmas, trace.SampledMapping{Start: v.Start, End: v.End, Offset: v.Offset, File: objfile.Key{Dev: v.Dev, Inode: v.Inode}})
		}
		mappings = p.vmas
	}
	p.agg.Add(trace.RawSample{PID: b.PID, TID: b.TID, ExecID: b.ExecID, Comm: b.Comm, Time: b.Time, User: b.User, Kernel: b.Kernel,
		ContextKind: contextKind(b.ContextSource), Context: b.Context, Mappings: mappings, OffCPU: time.Duration(b.OffCPU)})
}

// HandleProcessEvent tells the process tracker of execs and exits.
func (p *Pipeline) HandleProcessEvent(e bpf.ProcessEvent) {
	switch e.Kind {
	case bpf.ProcessExec:
		p.procs.Exec(e.PID, e.ExecID)
	case bpf.ProcessExit:
		p.procs.Exit(e.PID)
		p.targets.exited(e.PID)
	}
}

func (p *Pipeline) exportTarget() string {
	if !p.cfg.Export {
		return "none"
	}
	return p.cfg.OTLP.Endpoint
}

// targets notices when every --pid target has exited.
type targets struct {
	left        map[uint32]bool
	onAllExited func()
}

func newTargets(pids []uint32) *targets {
	t := &targets{left: map[uint32]bool{}}
	for _, pid := range pids {
		t.left[pid] = true
	}
	return t
}

func (t *targets) exited(pid uint32) {
	if !t.left[pid] {
		return
	}
	delete(t.left, pid)
	if len(t.left) == 0 && t.onAllExited != nil {
		t.onAllExited()
	}
}

// jittered spreads intervals by ±10% so a fleet of agents started together does not
// report in lockstep.
func jittered(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.2-0.1)*float64(d))
}

// waitBounded waits for wg, but not longer than d: a stage stuck in a system call must
// not hold up the exit.
func waitBounded(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// ringWatch warns once when the ring buffer overflows; the totals appear in the summary.
type ringWatch struct {
	sampler *bpf.Sampler
	log     *slog.Logger
	done    bool
}

func (w *ringWatch) check() {
	if w.done {
		return
	}
	dropped, err := w.sampler.RingBufferFull()
	if err != nil {
		w.log.Warn("cannot read kernel counters", "err", err)
		w.done = true
		return
	}
	if dropped > 0 {
		w.log.Warn("ring buffer full: the kernel is dropping samples faster than sonde reads them; lower --frequency or narrow --pid",
			"dropped", dropped)
		w.done = true
	}
}

// logSummary logs what every stage counted, each in its own group, at level.
func (p *Pipeline) logSummary(level slog.Level) {
	attrs := []any{"kernel", kernelSummary{p.sampler, p.cfg.BPFStats}, "processes", p.procs.Stats(), "stacks", p.agg.Stats()}
	if p.tables != nil {
		attrs = append(attrs, "unwind", p.tables.Stats())
	}
	for _, r := range p.runtimes {
		attrs = append(attrs, r.spec.Name, r.rt)
	}
	attrs = append(attrs, "symbols", p.symbolizer.Stats())
	if p.debuginfod != nil {
		attrs = append(attrs, "debuginfod", p.debuginfod.Stats())
	}
	if p.exporter != nil {
		attrs = append(attrs, "otlp", p.exporter.Stats())
	}
	// The checks see the resident set once a second, from the first poll on; the kernel's
	// high-water mark has the start-up and every moment between.
	peak := max(p.pressure.peakRSS.Load(), highWaterBytes())
	attrs = append(attrs, "memory", slog.GroupValue(slog.Int64("peak_rss_bytes", peak), slog.Uint64("sheds", p.pressure.shed.Load()), slog.Uint64("heap_trims", p.trim.trims.Load())))
	p.log.Log(context.Background(), level, "summary", attrs...)
}

// kernelSummary reports the kernel's counters and, with --bpf-stats, the program's cost.
type kernelSummary struct {
	s     *bpf.Sampler
	stats bool
}

func (k kernelSummary) LogValue() slog.Value {
	c, err := k.s.Counters()
	if err != nil {
		return slog.StringValue("unreadable: " + err.Error())
	}
	attrs := c.LogValue().Group()
	if c.Samples > 0 {
		attrs = append(attrs, slog.Uint64("ring_bytes_per_sample", k.s.RingBytes()/c.Samples))
	}
	if st, err := k.s.KernelState(); err == nil {
		attrs = append(attrs, slog.Int("processes", st.Processes), slog.Int("tables", st.Tables), slog.Int("go_runtimes", st.GoRuntimes))
	}
	if k.stats {
		// Per recorded sample, the program's whole cost: filtered-out runs on other CPUs included.
		if ps, err := k.s.ProgramStats(); err == nil && ps.Runs > 0 && c.Samples > 0 {
			attrs = append(attrs, slog.Uint64("bpf_runs", ps.Runs), slog.Int64("bpf_ns_per_run", ps.Runtime.Nanoseconds()/int64(ps.Runs)),
				slog.Int64("bpf_ns_per_sample", ps.Runtime.Nanoseconds()/int64(c.Samples)))
		}
		if ps, err := k.s.OffCPUProgramStats(); err == nil && ps.Runs > 0 {
			attrs = append(attrs, slog.Uint64("bpf_offcpu_runs", ps.Runs), slog.Int64("bpf_offcpu_ns", ps.Runtime.Nanoseconds()),
				slog.Int64("bpf_offcpu_ns_per_run", ps.Runtime.Nanoseconds()/int64(ps.Runs)))
		}
	}
	return slog.GroupValue(attrs...)
}

// offCPUWalks turns --off-cpu-rate into the sampler's setting, where 0 is its default.
func offCPUWalks(rate int) int {
	if rate == 0 {
		return -1 // every switch-out
	}
	return rate
}

func contextKind(s bpf.ContextSource) trace.ContextKind {
	switch s {
	case bpf.ContextOTel:
		return trace.ContextOTel
	case bpf.ContextGoLabels:
		return trace.ContextGoLabels
	}
	return trace.ContextNone
}

// frameDecoders are the runtimes as the aggregator decodes their frames, by number.
func (p *Pipeline) frameDecoders() trace.Runtimes {
	out := trace.Runtimes{}
	for _, r := range p.runtimes {
		out[r.spec.Number] = r.rt
	}
	return out
}

// namers are the runtimes as the symbolizer names their frames, by number.
func (p *Pipeline) namers() map[uint8]symbolize.InterpNamer {
	out := map[uint8]symbolize.InterpNamer{}
	for _, r := range p.runtimes {
		out[r.spec.Number] = r.rt
	}
	return out
}

// watchEvery is how often the reader's polls check sonde's memory and the kernel's
// counters (Polled).
const watchEvery = time.Second

// Polled runs, about once a second, the checks of sonde itself, on the ring buffer
// reader's wake-ups: the memory budget (pressure) and the ring's overflow (ringWatch).
// It implements bpf.Poller.
func (p *Pipeline) Polled(now time.Time) {
	if now.Sub(p.watchedAt) < watchEvery*9/10 { // a poll may come a little early
		return
	}
	p.watchedAt = now
	p.pressure.check()
	p.ringWatch.check()
}
