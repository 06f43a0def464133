package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/sonde-profiler/sonde/reporter/files"
	"github.com/sonde-profiler/sonde/reporter/merge"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/reporter/top"
	"github.com/sonde-profiler/sonde/trace"
)

// Sink is where each interval's symbolized profile goes: the terminal's top table, the
// output files, the collector, a live view. The loop hands it every interval, empty ones
// included, so that what it reports spans the run; Close finishes what it makes within ctx.
type Sink interface {
	Add(p *trace.Profile)
	Close(ctx context.Context) error
}

// topSink prints the hottest functions of the whole run at exit, and a word under them
// when a host-wide run found the host idle.
type topSink struct {
	table    *top.Table
	n        int
	out      io.Writer
	hostWide bool
	view     trace.View
}

func (s *topSink) Add(p *trace.Profile) { s.table.Add(p.ForView(s.view)) }

func (s *topSink) Close(context.Context) error {
	if err := s.table.Print(s.out, s.n); err != nil {
		return fmt.Errorf("print top table: %w", err)
	}
	_, total := s.table.Rows()
	if note := idleNote(s.hostWide, total, s.table.Period(), s.table.Span(), hostCPUs()); note != "" {
		if _, err := fmt.Fprintln(s.out, note); err != nil {
			return fmt.Errorf("print top table: %w", err)
		}
	}
	return nil
}

// fileSink merges the run into one profile as it goes, and writes it to the output files
// at exit: memory follows the distinct stacks, not the length of the run.
type fileSink struct {
	outputs  []files.Output
	merged   *merge.Merger
	facts    func() files.Facts
	log      *slog.Logger
	start    time.Time
	period   time.Duration
	hostWide bool
	view     trace.View
}

func (s *fileSink) Add(p *trace.Profile) { s.merged.Add(p) }

func (s *fileSink) Close(context.Context) error {
	p := s.merged.Profile()
	if len(p.Samples) == 0 {
		// An idle target or host: still a valid profile, covering the run.
		s.log.Warn("no samples were collected: the profiled processes did not run on a CPU")
		if p.Start.IsZero() {
			p.Start, p.End, p.Period = s.start, time.Now().Round(0), s.period
		}
	}
	if n := s.merged.Dropped(); n > 0 {
		s.log.Warn("the output profile reached its share of --memory-limit; samples of stacks first seen later were left out", "samples_left_out", n)
	}
	facts := s.facts()
	facts.Note = idleNote(s.hostWide, p.TotalCount(), p.Period, p.End.Sub(p.Start), hostCPUs())
	facts.View = s.view
	var errs []error
	for _, o := range s.outputs {
		if err := o.Write(p, facts); err != nil {
			errs = append(errs, err)
			continue
		}
		s.log.Info("wrote profile", "file", o.Path)
	}
	return errors.Join(errs...)
}

// exportSink sends each interval to the collector; the exporter's Run is a stage of its
// own, which close stops, giving it its configured timeout to deliver what is queued.
type exportSink struct {
	exporter *otlp.Exporter
	log      *slog.Logger
	cancel   context.CancelFunc
	done     chan error
	once     sync.Once
}

func newExportSink(e *otlp.Exporter, log *slog.Logger) *exportSink {
	ctx, cancel := context.WithCancel(context.Background())
	s := &exportSink{exporter: e, log: log, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- e.Run(ctx) }()
	return s
}

func (s *exportSink) Add(p *trace.Profile) {
	if len(p.Samples) == 0 {
		return
	}
	if err := s.exporter.EnqueueProfiles(p); err != nil {
		// Parts that encode still go; the failure is counted in the exporter's stats.
		s.once.Do(func() { s.log.Warn("part of an interval could not be encoded and was dropped", "err", err) })
	}
}

// close reports a collector that did not take everything in the log, not as a failure
// of the run: the profiles it did take, and the output files, stand.
func (s *exportSink) Close(context.Context) error {
	s.cancel()
	if err := <-s.done; err != nil {
		s.log.Warn("collector did not take every interval before exit", "err", err)
	}
	return nil
}
