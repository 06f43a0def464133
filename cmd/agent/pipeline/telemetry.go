package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc/credentials"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/symbolize/debuginfod"
)

// healthStale is how long the ring buffer may go unread before /healthz says sampling
// has stopped: the reader polls at least every second.
const healthStale = 5 * time.Second

// health is what /healthz answers from: ready once the programs are attached and the ring
// buffer has been read, unhealthy once sampling stopped or the reader stalled.
type health struct {
	sampler *bpf.Sampler
	started atomic.Bool
	stopped atomic.Bool
}

func (h *health) status() (int, string) {
	switch {
	case h.stopped.Load():
		return http.StatusServiceUnavailable, "sampling stopped"
	case !h.started.Load() || h.sampler.Polls() == 0:
		return http.StatusServiceUnavailable, "starting"
	case time.Since(h.sampler.LastPoll()) > healthStale:
		return http.StatusServiceUnavailable, fmt.Sprintf("ring buffer not read for %v", time.Since(h.sampler.LastPoll()).Round(time.Second))
	default:
		return http.StatusOK, "sampling"
	}
}

// telemetry is sonde's own metrics: through the OpenTelemetry metrics API, served in
// Prometheus text format on --metrics-addr and, with --metrics-otlp, pushed to the
// collector the profiles go to.
type telemetry struct {
	provider *sdkmetric.MeterProvider
	server   *http.Server
	listener net.Listener
}

// newTelemetry registers sonde's instruments, reading each stage's counters when metrics
// are collected, and listens on cfg.MetricsAddr. It serves nothing until serve.
func newTelemetry(p *Pipeline, h *health) (*telemetry, error) {
	reg := prometheus.NewRegistry()
	// The live heap as of the last collection (go_gc_heap_live_bytes) beside the usual
	// memstats: what sonde holds, without the garbage the next collection takes. Forced
	// collections (go_gc_cycles_forced_gc_cycles_total) are sonde's own: the heap given
	// back at intervals' ends, after large unwind tables, and under memory pressure.
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$|^/gc/cycles/forced:gc-cycles$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := promexporter.New(promexporter.WithRegisterer(reg), promexporter.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(exp)}
	if p.cfg.MetricsOTLP {
		push, err := otlpMetricExporter(p)
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(push, sdkmetric.WithInterval(p.cfg.Interval))))
	}
	t := &telemetry{provider: sdkmetric.NewMeterProvider(opts...)}
	if err := registerInstruments(t.provider.Meter("sonde"), p); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		code, msg := h.status()
		w.WriteHeader(code)
		fmt.Fprintln(w, msg)
	})
	if t.listener, err = net.Listen("tcp", p.cfg.MetricsAddr); err != nil {
		return nil, UsageError{fmt.Errorf("--metrics-addr %s: %w", p.cfg.MetricsAddr, err)}
	}
	t.server = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return t, nil
}

func (t *telemetry) serve(log *slog.Logger) {
	go func() {
		if err := t.server.Serve(t.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics server stopped", "err", err)
		}
	}()
}

// close stops serving and pushes the last metrics.
func (t *telemetry) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	t.server.Shutdown(ctx)
	t.provider.Shutdown(ctx)
}

// otlpMetricExporter pushes to the profiles' collector, with the same TLS and headers.
func otlpMetricExporter(p *Pipeline) (sdkmetric.Exporter, error) {
	addr, plaintext, err := p.cfg.OTLP.Target()
	if err != nil {
		return nil, UsageError{fmt.Errorf("--metrics-otlp: %w", err)}
	}
	opts := []otlpmetricgrpc.Option{otlpmetricgrpc.WithEndpoint(addr), otlpmetricgrpc.WithHeaders(p.cfg.OTLP.Headers), otlpmetricgrpc.WithTimeout(p.cfg.OTLP.Timeout)}
	if plaintext {
		opts = append(opts, otlpmetricgrpc.WithInsecure())
	} else {
		tc, err := p.cfg.OTLP.TLS()
		if err != nil {
			return nil, UsageError{fmt.Errorf("--metrics-otlp: %w", err)}
		}
		opts = append(opts, otlpmetricgrpc.WithTLSCredentials(credentials.NewTLS(tc)))
	}
	exp, err := otlpmetricgrpc.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("--metrics-otlp: %w", err)
	}
	return exp, nil
}

// registerInstruments makes the instruments and one callback that reads every stage's
// counters once per collection.
func registerInstruments(m metric.Meter, p *Pipeline) error {
	var errs []error
	counter := func(name, desc, unit string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, desc, unit string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return g
	}
	var (
		samples       = counter("sonde.samples", "Samples the kernel recorded.", "{sample}")
		lost          = counter("sonde.samples.lost", "Samples the kernel dropped because the ring buffer was full.", "{sample}")
		walks         = counter("sonde.unwind.walks", "User-stack walks, by how they ended.", "{walk}")
		stale         = counter("sonde.unwind.stale_mappings", "Samples whose process had exec'd since its mappings were written.", "{sample}")
		unresolved    = counter("sonde.frames.unresolved", "User frames no mapping covered.", "{frame}")
		symFailed     = counter("sonde.symbolize.files.failed", "Object files that could not be read for names.", "{file}")
		locations     = counter("sonde.symbolize.locations", "Locations symbolization was asked to name, by outcome.", "{location}")
		fileRefused   = counter("sonde.files.refused", "Mapped files refused, by reason.", "{file}")
		procReads     = counter("sonde.process.reads", "Readings of /proc/PID/maps, and execs not read: gone when their grace ended, or over the exec rate limit.", "{read}")
		exports       = counter("sonde.export.requests", "Export attempts to the collector, by outcome.", "{request}")
		sentBytes     = counter("sonde.export.size", "Encoded bytes of the requests the collector accepted.", "By")
		dropped       = counter("sonde.export.intervals.dropped", "Intervals dropped from a full queue or at shutdown.", "{interval}")
		queue         = gauge("sonde.export.queue.intervals", "Intervals waiting for the collector.", "{interval}")
		queueBytes    = gauge("sonde.export.queue.size", "Encoded bytes waiting for the collector.", "By")
		mapEntries    = gauge("sonde.bpf.map.entries", "Entries of the BPF maps that grow with the host.", "{entry}")
		mapCapacity   = gauge("sonde.bpf.map.capacity", "Capacity of those maps.", "{entry}")
		rows          = gauge("sonde.unwind.rows", "Unwind table rows in the kernel.", "{row}")
		rowsBudget    = gauge("sonde.unwind.rows.budget", "Rows the unwind tables may hold.", "{row}")
		processes     = gauge("sonde.processes", "Processes tracked.", "{process}")
		files         = gauge("sonde.files", "Mapped files tracked.", "{file}")
		rss           = gauge("sonde.memory.rss", "sonde's resident memory.", "By")
		symCache      = gauge("sonde.symbolize.cache.size", "Estimated memory the symbolizer's caches hold, by cache.", "By")
		sheds         = counter("sonde.memory.sheds", "Times caches or queued intervals were dropped to stay within --memory-limit.", "{shed}")
		heapTrims     = counter("sonde.memory.heap_trims", "Times an interval's end collected and gave the Go heap's free pages back to the system.", "{trim}")
		dbgFetches    = counter("sonde.debuginfod.fetches", "Requests sent to debuginfod servers.", "{request}")
		dbgNotFound   = counter("sonde.debuginfod.not_found", "Requests a debuginfod server answered 404: it has no such file.", "{request}")
		dbgFiles      = counter("sonde.debuginfod.lookups", "Build IDs looked up: hit (in the disk cache), downloaded, miss (no server had it).", "{file}")
		dbgBytes      = counter("sonde.debuginfod.size", "Bytes of the debug files downloaded and kept.", "By")
		dbgErrors     = counter("sonde.debuginfod.errors", "Failed debuginfod requests, by reason.", "{request}")
		dbgCache      = gauge("sonde.debuginfod.cache.size", "Bytes the debuginfod cache directory holds.", "By")
		offSamples    = counter("sonde.offcpu.samples", "Waits off the CPU recorded (--off-cpu): threads back on a CPU, or goroutines run again (--off-cpu-goroutines), after at least --off-cpu-min.", "{sample}")
		offGoParks    = counter("sonde.offcpu.goroutine_parks", "Goroutines parking in Go's scheduler (--off-cpu-goroutines), by outcome: walked (stack sent) or skipped (sampled out when they come too fast).", "{park}")
		offSwitches   = counter("sonde.offcpu.switches", "Threads going off the CPU to wait (--off-cpu), by outcome: walked (stacks sent) or skipped (sampled out when they come too fast).", "{switch}")
		offThreads    = gauge("sonde.offcpu.threads", "Waiting threads whose stacks sonde holds until they run again, where: kernel or user.", "{thread}")
		observables   = []metric.Observable{offSamples, offGoParks, offSwitches, offThreads, samples, lost, walks, stale, unresolved, symFailed, locations, fileRefused, procReads, exports, sentBytes, dropped, queue, queueBytes, mapEntries, mapCapacity, rows, rowsBudget, processes, files, rss, symCache, sheds, heapTrims, dbgFetches, dbgNotFound, dbgFiles, dbgBytes, dbgErrors, dbgCache}
		outcome       = func(v string) metric.ObserveOption { return metric.WithAttributes(attribute.String("outcome", v)) }
		reason        = func(v string) metric.ObserveOption { return metric.WithAttributes(attribute.String("reason", v)) }
		mapName       = func(v string) metric.ObserveOption { return metric.WithAttributes(attribute.String("map", v)) }
		nonNegative   = func(v uint64) int64 { return int64(min(v, 1<<63-1)) }
		observeStages = func(_ context.Context, o metric.Observer) error {
			if c, err := p.sampler.Counters(); err == nil {
				o.ObserveInt64(samples, nonNegative(c.Samples))
				o.ObserveInt64(lost, nonNegative(c.RingBufferFull))
				o.ObserveInt64(stale, nonNegative(c.StaleMappings))
				for end, n := range c.UnwindEnds {
					o.ObserveInt64(walks, nonNegative(n), outcome(bpf.UnwindEnd(end).String()))
				}
				if p.cfg.OffCPU {
					o.ObserveInt64(offSamples, nonNegative(c.OffCPU.Samples+c.OffCPU.GoSamples))
					o.ObserveInt64(offSwitches, nonNegative(c.OffCPU.Walked), outcome("walked"))
					o.ObserveInt64(offSwitches, nonNegative(c.OffCPU.Switches-min(c.OffCPU.Walked, c.OffCPU.Switches)), outcome("skipped"))
					if p.cfg.OffCPUGoroutines {
						o.ObserveInt64(offGoParks, nonNegative(c.OffCPU.GoWalked), outcome("walked"))
						o.ObserveInt64(offGoParks, nonNegative(c.OffCPU.GoParks-min(c.OffCPU.GoWalked, c.OffCPU.GoParks)), outcome("skipped"))
					}
				}
			}
			if p.cfg.OffCPU {
				if st, err := p.sampler.OffCPUState(); err == nil {
					where := func(v string) metric.ObserveOption { return metric.WithAttributes(attribute.String("where", v)) }
					o.ObserveInt64(offThreads, int64(st.Kernel), where("kernel"))
					o.ObserveInt64(offThreads, int64(st.User), where("user"))
				}
			}
			if ks, err := p.sampler.KernelState(); err == nil {
				o.ObserveInt64(mapEntries, int64(ks.Processes), mapName("proc_maps"))
				o.ObserveInt64(mapEntries, int64(ks.Tables), mapName("unwind_tables"))
				o.ObserveInt64(mapCapacity, int64(p.budget.maxProcesses), mapName("proc_maps"))
				o.ObserveInt64(mapCapacity, int64(bpf.DefaultMaxTables), mapName("unwind_tables"))
			}
			ps := p.procs.Stats()
			o.ObserveInt64(processes, int64(ps.Processes))
			o.ObserveInt64(files, int64(ps.Files))
			for r, n := range map[string]uint64{"not_regular": ps.FilesNotRegular, "replaced": ps.FilesReplaced, "too_large": ps.FilesTooLarge, "fuse": ps.FilesFUSE, "stalled": ps.FilesStalled} {
				o.ObserveInt64(fileRefused, nonNegative(n), reason(r))
			}
			for r, n := range map[string]uint64{"read": ps.MapsReads, "exited_in_grace": ps.ExecGraceSkipped, "rate_limited": ps.ExecReadsSkipped} {
				o.ObserveInt64(procReads, nonNegative(n), outcome(r))
			}
			o.ObserveInt64(unresolved, nonNegative(p.agg.Stats().UnresolvedFrames))
			if p.tables != nil {
				ts := p.tables.Stats()
				o.ObserveInt64(rows, int64(ts.Rows))
				o.ObserveInt64(rowsBudget, int64(ts.RowsBudget))
			}
			if ss := p.symStats.Load(); ss != nil {
				o.ObserveInt64(symFailed, int64(ss.FilesFailed))
				o.ObserveInt64(locations, int64(ss.LocationsNamed), outcome("named"))
				o.ObserveInt64(locations, int64(ss.LocationsUnnamed), outcome("unnamed"))
				cache := func(v string) metric.ObserveOption { return metric.WithAttributes(attribute.String("cache", v)) }
				o.ObserveInt64(symCache, ss.CachedFileBytes, cache("files"))
				o.ObserveInt64(symCache, ss.CachedDWARFBytes, cache("dwarf_units"))
				o.ObserveInt64(symCache, ss.DecompressedBytes, cache("dwarf_sections"))
				o.ObserveInt64(symCache, ss.CachedAddressBytes, cache("addresses"))
				o.ObserveInt64(symCache, ss.KernelSymbolBytes, cache("kernel_symbols"))
			}
			if p.exporter != nil {
				es := p.exporter.Stats()
				o.ObserveInt64(exports, nonNegative(es.SentRequests), outcome("sent"))
				o.ObserveInt64(exports, nonNegative(es.FailedAttempts), outcome("failed"))
				o.ObserveInt64(exports, nonNegative(es.RejectedRequests), outcome("rejected"))
				o.ObserveInt64(sentBytes, nonNegative(es.SentBytes))
				o.ObserveInt64(dropped, nonNegative(es.DroppedIntervals))
				o.ObserveInt64(queue, int64(es.Queued))
				o.ObserveInt64(queueBytes, int64(es.QueuedBytes))
			}
			if p.debuginfod != nil {
				ds := p.debuginfod.Stats()
				o.ObserveInt64(dbgFetches, ds.Fetches)
				o.ObserveInt64(dbgNotFound, ds.NotFound)
				o.ObserveInt64(dbgFiles, ds.Hits, outcome("hit"))
				o.ObserveInt64(dbgFiles, ds.Downloads, outcome("downloaded"))
				o.ObserveInt64(dbgFiles, ds.Misses, outcome("miss"))
				o.ObserveInt64(dbgBytes, ds.Bytes)
				for _, r := range debuginfod.ErrorKinds {
					o.ObserveInt64(dbgErrors, ds.Errors[r], reason(r))
				}
				o.ObserveInt64(dbgCache, ds.CacheBytes)
			}
			o.ObserveInt64(rss, residentBytes())
			o.ObserveInt64(sheds, nonNegative(p.pressure.shed.Load()))
			o.ObserveInt64(heapTrims, nonNegative(p.trim.trims.Load()))
			return nil
		}
	)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("metrics instruments: %w", err)
	}
	_, err := m.RegisterCallback(observeStages, observables...)
	return err
}
