package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/reporter/pprof"
	"github.com/sonde-profiler/sonde/reporter/top"
	"github.com/sonde-profiler/sonde/symbolize"
	"github.com/sonde-profiler/sonde/trace"
	"github.com/sonde-profiler/sonde/unwind"
)

// run samples until ctx ends, --duration passes or every --pid target exits. Every
// interval it symbolizes what was collected and hands it to the exporter; at the end it
// writes --output and prints the top table.
func run(ctx context.Context, cfg *config, log *slog.Logger) error {
	if err := checkPIDsExist(cfg.pids); err != nil {
		return usageError{err}
	}
	var out *pendingFile
	if cfg.output != "" {
		var err error
		if out, err = createPending(cfg.output); err != nil {
			return usageError{err}
		}
		defer out.abort()
	}
	resource, err := otlp.ResourceFromEnv(os.Getenv)
	if err != nil {
		log.Warn("resource attributes from the environment ignored", "err", err)
	}
	encodeOpts := otlp.EncodeOptions{Version: version, Timestamps: cfg.timestamps}

	var exporter *otlp.Exporter
	if cfg.export {
		if exporter, err = otlp.New(cfg.otlp, otlp.WithLogger(log), otlp.WithResource(resource), otlp.WithEncodeOptions(encodeOpts)); err != nil {
			return usageError{err}
		}
	}

	if cfg.unwind == "tables" && cfg.unwindRows == 0 {
		cfg.unwindRows = unwind.EstimateRows(unwind.MappedExecutables("/proc", cfg.pids))
	}
	sampler, err := bpf.Load(bpf.Config{
		PIDs:              cfg.pids,
		Frequency:         cfg.frequency,
		KernelStacks:      cfg.kernelStacks,
		CollectStats:      cfg.bpfStats,
		FramePointersOnly: cfg.unwind == "fp",
		UnwindRows:        cfg.unwindRows,
	})
	if err != nil {
		return err
	}
	defer sampler.Close()
	var tables *unwind.Maintainer
	if cfg.unwind == "tables" {
		tables = unwind.NewMaintainer(kernelTables{sampler}, bpf.MaxProcessMappings, func(what string, err error) {
			log.Info("no unwind table; frames there are walked by frame pointer", "file", what, "err", err)
		})
	}

	kernel, err := trace.KernelMapping("/sys/kernel/notes")
	if err != nil {
		log.Debug("kernel build id unavailable", "err", err)
	}
	period := time.Second / time.Duration(cfg.frequency)
	runStart := time.Now().Round(0)
	collector, err := trace.NewCollector(trace.Config{
		Period:         period,
		Kernel:         kernel,
		KeepTimestamps: cfg.timestamps,
		OnFileError: func(path string, err error) {
			log.Info("cannot identify mapped file; its frames keep addresses only", "file", path, "err", err)
		},
		Observer:      observer(tables),
		ChunkSize:     cfg.chunkSize,
		ChunkCapacity: cfg.chunkCache,
	}, runStart)
	if err != nil {
		return usageError{err}
	}
	// Targets named in advance get their tables before the first sample.
	for _, pid := range cfg.pids {
		collector.Prime(pid)
	}
	if err := sampler.Start(); err != nil {
		return err
	}
	symbolizer := symbolize.New(cfg.symbolize)
	table := top.NewTable()
	var kept []*trace.Profile // the whole run, for --output
	deliver := func(p *trace.Profile) {
		if len(p.Samples) == 0 {
			return
		}
		for _, err := range symbolizer.Symbolize(p) {
			log.Info("cannot symbolize; frames keep addresses and build ids", "err", err)
		}
		table.Add(p)
		if out != nil {
			kept = append(kept, p)
		}
		if exporter != nil {
			exporter.EnqueueProfiles(p)
		}
	}
	log.Info("sampling", "frequency_hz", cfg.frequency, "pids", cfg.pids, "duration", cfg.duration,
		"otlp_endpoint", exportTarget(cfg), "interval", cfg.interval, "version", version)

	// The exporter outlives sampling so the last interval can still be sent.
	exportCtx, stopExport := context.WithCancel(context.Background())
	defer stopExport()
	exportDone := make(chan error, 1)
	if exporter != nil {
		go func() { exportDone <- exporter.Run(exportCtx) }()
	} else {
		exportDone <- nil
	}

	if cfg.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.duration)
		defer cancel()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sink := newSampleSink(collector, cfg.pids, func() {
		log.Info("every target process exited; stopping")
		cancel()
	})
	var wg sync.WaitGroup
	wg.Go(func() { watchCounters(ctx, sampler, log) })
	sampled := make(chan error, 1)
	go func() { sampled <- sampler.Run(ctx, sink) }()

	var runErr error
	timer := time.NewTimer(jittered(cfg.interval))
	for done := false; !done; {
		select {
		case <-timer.C:
			deliver(collector.Flush(time.Now()))
			timer.Reset(jittered(cfg.interval))
		case runErr = <-sampled:
			done = true
		}
	}
	timer.Stop()
	cancel()
	wg.Wait()
	if runErr != nil {
		log.Error("sampling stopped early; reporting what was collected", "err", runErr)
	}
	deliver(collector.Flush(time.Now()))
	stopExport()
	if err := <-exportDone; err != nil {
		log.Warn("collector did not take every interval before exit", "err", err)
	}
	logSummary(log, sampler, collector, symbolizer, exporter, tables, cfg.bpfStats)

	if out != nil {
		if len(kept) == 0 {
			// An idle target or host: still a valid profile, covering the run.
			log.Warn("no samples were collected: the profiled processes did not run on a CPU")
			kept = []*trace.Profile{{Start: runStart, End: time.Now().Round(0), Period: period}}
		}
		if err := writeOutput(out, cfg, kept, resource, encodeOpts); err != nil {
			return err
		}
		log.Info("wrote profile", "file", cfg.output)
	}
	if cfg.top > 0 {
		if err := table.Print(os.Stdout, cfg.top); err != nil {
			return fmt.Errorf("print top table: %w", err)
		}
	}
	return runErr
}

// observer keeps a nil *Maintainer from becoming a non-nil interface.
func observer(m *unwind.Maintainer) trace.MappingObserver {
	if m == nil {
		return nil
	}
	return m
}

func exportTarget(cfg *config) string {
	if !cfg.export {
		return "none"
	}
	return cfg.otlp.Endpoint
}

// jittered spreads intervals by ±10% so a fleet of agents started together does not
// report in lockstep.
func jittered(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.2-0.1)*float64(d))
}

func writeOutput(out *pendingFile, cfg *config, profiles []*trace.Profile, resource otlp.Resource, opts otlp.EncodeOptions) error {
	format, err := cfg.outputFormat()
	if err != nil {
		return err
	}
	return out.commit(func(f *os.File) error {
		if format == formatOTLP {
			return otlp.WriteFile(f.Name(), otlp.Encode(profiles, resource, opts))
		}
		return pprof.Write(f, profiles...)
	})
}

// sampleSink feeds kernel records to the collector and notices when every target exited.
type sampleSink struct {
	collector *trace.Collector
	targets   map[uint32]bool
	allExited func()
}

func newSampleSink(c *trace.Collector, pids []uint32, allExited func()) *sampleSink {
	s := &sampleSink{collector: c, targets: map[uint32]bool{}, allExited: allExited}
	for _, pid := range pids {
		s.targets[pid] = true
	}
	return s
}

func (s *sampleSink) HandleSample(b *bpf.Sample) {
	s.collector.Add(trace.RawSample{PID: b.PID, TID: b.TID, Comm: b.Comm, Time: b.Time, User: b.User, Kernel: b.Kernel})
}

func (s *sampleSink) HandleProcessEvent(e bpf.ProcessEvent) {
	switch e.Kind {
	case bpf.ProcessExec:
		s.collector.ProcessExec(e.PID)
	case bpf.ProcessExit:
		s.collector.ProcessExit(e.PID)
		if s.targets[e.PID] {
			delete(s.targets, e.PID)
			if len(s.targets) == 0 {
				s.allExited()
			}
		}
	}
}

// watchCounters warns once when the ring buffer overflows; the totals appear in the summary.
func watchCounters(ctx context.Context, s *bpf.Sampler, log *slog.Logger) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c, err := s.Counters()
		if err != nil {
			log.Warn("cannot read kernel counters", "err", err)
			return
		}
		if c.RingBufferFull > 0 {
			log.Warn("ring buffer full: the kernel is dropping samples faster than sonde reads them; lower --frequency or narrow --pid",
				"dropped", c.RingBufferFull)
			return
		}
	}
}

func logSummary(log *slog.Logger, s *bpf.Sampler, c *trace.Collector, sym *symbolize.Symbolizer, exp *otlp.Exporter, tables *unwind.Maintainer, bpfStats bool) {
	attrs := []any{}
	if kc, err := s.Counters(); err == nil {
		if kc.Samples > 0 {
			attrs = append(attrs, "ring_bytes_per_sample", s.RingBytes()/kc.Samples)
		}
		attrs = append(attrs, "kernel_samples", kc.Samples, "ring_buffer_full", kc.RingBufferFull,
			"user_stack_errors", kc.UserStackErrors, "kernel_stack_errors", kc.KernelStackErrors)
		for end, n := range kc.UnwindEnds {
			if n > 0 {
				attrs = append(attrs, "unwind_"+bpf.UnwindEnd(end).String(), n)
			}
		}
	}
	if tables != nil {
		ts := tables.Stats()
		used, capacity := s.RowsUsed()
		attrs = append(attrs, "unwind_files", ts.Files, "unwind_rows", used, "unwind_rows_capacity", capacity,
			"unwind_files_fp", ts.FilesNoTable, "unwind_files_failed", ts.FilesFailed, "unwind_files_overflow", ts.FilesOverflow)
	}
	cs := c.Stats()
	ss := sym.Stats()
	attrs = append(attrs, "samples", cs.Samples, "chunks", cs.Chunks, "locations", cs.Locations, "chunk_hits", cs.ChunkHits, "chunk_misses", cs.ChunkMisses,
		"chunk_evictions", cs.ChunkEvictions, "unresolved_frames", cs.UnresolvedFrames, "maps_errors", cs.MapsErrors,
		"files_unidentified", cs.FileErrors, "symbol_files", ss.FilesLoaded, "symbol_files_failed", ss.FilesFailed,
		"locations_named", ss.LocationsNamed, "locations_unnamed", ss.LocationsUnnamed)
	if exp != nil {
		es := exp.Stats()
		attrs = append(attrs, "otlp_sent_requests", es.SentRequests, "otlp_sent_samples", es.SentSamples,
			"otlp_dropped_intervals", es.DroppedIntervals, "otlp_failed_attempts", es.FailedAttempts)
	}
	if bpfStats {
		// Per recorded sample, the program's whole cost: filtered-out runs on other CPUs included.
		kc, kerr := s.Counters()
		if ps, err := s.ProgramStats(); err == nil && kerr == nil && ps.Runs > 0 && kc.Samples > 0 {
			attrs = append(attrs, "bpf_runs", ps.Runs, "bpf_ns_per_run", ps.Runtime.Nanoseconds()/int64(ps.Runs),
				"bpf_ns_per_sample", ps.Runtime.Nanoseconds()/int64(kc.Samples))
		}
	}
	log.Info("summary", attrs...)
}

// pendingFile is an output file that appears only when complete: sonde checks it can
// write there before sampling, and a failed run leaves nothing half-written.
type pendingFile struct {
	tmp  *os.File
	path string
}

func createPending(path string) (*pendingFile, error) {
	// The name keeps its extension last: writers choose the format by it.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp*-"+filepath.Base(path))
	if err != nil {
		return nil, fmt.Errorf("--output %s: cannot write there: %w", path, err)
	}
	return &pendingFile{tmp: tmp, path: path}, nil
}

func (p *pendingFile) commit(write func(*os.File) error) error {
	if err := write(p.tmp); err != nil {
		return fmt.Errorf("write %s: %w", p.path, err)
	}
	if err := p.tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("write %s: %w", p.path, err)
	}
	if err := p.tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", p.path, err)
	}
	if err := os.Rename(p.tmp.Name(), p.path); err != nil {
		return fmt.Errorf("write %s: %w", p.path, err)
	}
	p.tmp = nil
	return nil
}

func (p *pendingFile) abort() {
	if p.tmp != nil {
		p.tmp.Close()
		os.Remove(p.tmp.Name())
	}
}
