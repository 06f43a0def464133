package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/reporter/pprof"
	"github.com/sonde-profiler/sonde/reporter/top"
	"github.com/sonde-profiler/sonde/symbolize"
	"github.com/sonde-profiler/sonde/trace"
)

// run samples until ctx ends, --duration passes or every --pid target exits, then writes
// what was collected.
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

	sampler, err := bpf.Load(bpf.Config{
		PIDs:         cfg.pids,
		Frequency:    cfg.frequency,
		KernelStacks: cfg.kernelStacks,
		CollectStats: cfg.bpfStats,
	})
	if err != nil {
		return err
	}
	defer sampler.Close()

	kernel, err := trace.KernelMapping("/sys/kernel/notes")
	if err != nil {
		log.Debug("kernel build id unavailable", "err", err)
	}
	start := time.Now()
	collector := trace.NewCollector(trace.Config{
		Period: time.Second / time.Duration(cfg.frequency),
		Kernel: kernel,
		OnFileError: func(path string, err error) {
			log.Info("cannot identify mapped file; its frames keep addresses only", "file", path, "err", err)
		},
	}, start)
	log.Info("sampling", "frequency_hz", cfg.frequency, "pids", cfg.pids, "duration", cfg.duration, "version", version)

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
	runErr := sampler.Run(ctx, sink)
	cancel()
	wg.Wait()
	if runErr != nil {
		log.Error("sampling stopped early; writing what was collected", "err", runErr)
	}

	profile := collector.Flush(time.Now())
	symbolizer := symbolize.New(symbolize.Options{})
	for _, err := range symbolizer.Symbolize(profile) {
		log.Info("cannot symbolize; frames keep addresses and build ids", "err", err)
	}
	logSummary(log, sampler, collector, symbolizer, cfg.bpfStats)

	if out != nil {
		if err := out.commit(func(f *os.File) error { return pprof.Write(f, profile) }); err != nil {
			return err
		}
		log.Info("wrote profile", "file", cfg.output, "samples", profile.TotalCount())
	}
	if cfg.top > 0 {
		if err := top.Print(os.Stdout, cfg.top, profile); err != nil {
			return fmt.Errorf("print top table: %w", err)
		}
	}
	return runErr
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

func logSummary(log *slog.Logger, s *bpf.Sampler, c *trace.Collector, sym *symbolize.Symbolizer, bpfStats bool) {
	attrs := []any{}
	if kc, err := s.Counters(); err == nil {
		attrs = append(attrs, "kernel_samples", kc.Samples, "ring_buffer_full", kc.RingBufferFull,
			"user_stack_errors", kc.UserStackErrors, "kernel_stack_errors", kc.KernelStackErrors)
	}
	cs := c.Stats()
	ss := sym.Stats()
	attrs = append(attrs, "samples", cs.Samples, "unresolved_frames", cs.UnresolvedFrames, "maps_errors", cs.MapsErrors,
		"files_unidentified", cs.FileErrors, "symbol_files", ss.FilesLoaded, "symbol_files_failed", ss.FilesFailed,
		"locations_named", ss.LocationsNamed, "locations_unnamed", ss.LocationsUnnamed)
	if bpfStats {
		if ps, err := s.ProgramStats(); err == nil && ps.Runs > 0 {
			attrs = append(attrs, "bpf_runs", ps.Runs, "bpf_ns_per_run", ps.Runtime.Nanoseconds()/int64(ps.Runs))
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
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
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
