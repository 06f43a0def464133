package trace

import (
	"cmp"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/sonde-profiler/sonde/tracectx"
)

// Aliases, so that reporters need not know where trace contexts come from.
type (
	// Link names the span a sample was taken in; the zero Link none.
	Link = tracectx.Link
	// Attribute is a string attribute of a sample, from its trace context.
	Attribute = tracectx.Attribute
)

// ContextKind says who published a sample's trace context (bpf.ContextSource's values).
type ContextKind uint8

const (
	ContextNone ContextKind = iota
	// ContextOTel: an OpenTelemetry thread context record (OTEP 4947).
	ContextOTel
	// ContextGoLabels: a goroutine's pprof labels, as the kernel packs them.
	ContextGoLabels
)

// contextRecheck is how often a process that may publish a context, or did, is looked at
// again: a service starts its SDK when it pleases, and may update its resource.
const contextRecheck = 5 * time.Second

// readContext looks at an image's trace context after a reading of its mappings, and
// tells the kernel and the image's Process what changed. Run's goroutine only.
func (p *Processes) readContext(img *image, snap *snapshot, ctxAddr uint64) {
	if p.contexts == nil {
		return
	}
	ms := make([]tracectx.Mapping, 0, len(snap.mappings))
	for _, m := range snap.mappings {
		ms = append(ms, tracectx.Mapping{File: m.File, Start: m.Start, Offset: m.Offset, Path: m.Path})
	}
	p.updateContext(img, ms, ctxAddr)
}

// checkContext looks again at an image's process context, reading only where its mapping
// is now. Run's goroutine only.
func (p *Processes) checkContext(img *image) {
	snap := img.maps.Load()
	if p.contexts == nil || snap == nil || img.forgotten.Load() {
		return
	}
	_, ctxAddr, err := readMapsFile(filepath.Join(p.procFS, strconv.FormatUint(uint64(img.pid), 10), "maps"))
	if err != nil {
		return
	}
	p.readContext(img, snap, ctxAddr)
}

func (p *Processes) updateContext(img *image, ms []tracectx.Mapping, ctxAddr uint64) {
	img.ctxCheckAt = time.Now()
	prev := img.ctx.Load()
	st := p.contexts.Update(img.pid, prev, ms, ctxAddr)
	img.ctx.Store(st)
	p.mu.Lock()
	p.stats.Contexts = p.contexts.Stats
	p.mu.Unlock()
	var was tracectx.Kernel
	if prev != nil {
		was = prev.Kernel
	}
	if !sameKernel(was, st.Kernel) {
		p.cfg.Contexts.TraceContext(img.pid, img.execID.Load(), st.Kernel)
	}
	if st.Context == nil || (prev != nil && prev.Context == st.Context) {
		return
	}
	// A new resource: a new Process, described again, which the image's samples take up.
	if proc := img.proc.Load(); proc != nil && !maps.Equal(proc.Published, st.Context.Resource) {
		next := *proc
		next.Published = st.Context.Resource
		next.Attributes = nil
		if p.cfg.Describer != nil {
			img.described.Store(p.cfg.Describer.Describe(&next))
		}
		img.proc.Store(&next)
	}
}

func sameKernel(a, b tracectx.Kernel) bool {
	return a.HasTLS == b.HasTLS && a.TLS == b.TLS && (a.Go == nil) == (b.Go == nil) && (a.Go == nil || *a.Go == *b.Go)
}

// scheduleContextChecks asks Run to look again at the processes that may publish a
// trace context, or did, and were not looked at for a while.
func (p *Processes) scheduleContextChecks() {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for pid, img := range p.images {
		st := img.ctx.Load()
		if st == nil || (!st.MayPublish && st.ContextAddr == 0) || now.Sub(img.ctxCheckAt) < contextRecheck {
			continue
		}
		p.queueCheck(pid)
	}
}

// refreshContext asks for another look at an image's process context: a sample named a
// key its key map lacks, which the map, append-only, may have gained since.
func (p *Processes) refreshContext(img *image) {
	if time.Since(img.ctxCheckAt) < time.Second {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.images[img.pid] == img {
		p.queueCheck(img.pid)
	}
}

// queueCheck queues a look at pid's context. Caller holds mu.
func (p *Processes) queueCheck(pid uint32) {
	if p.checking[pid] || len(p.checks) >= p.cfg.MaxPendingReads {
		return
	}
	p.checking[pid] = true
	p.checks = append(p.checks, pid)
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// keyMap returns the key map an image's process context published, if any.
func (img *image) keyMap() []string {
	if img == nil {
		return nil
	}
	if st := img.ctx.Load(); st != nil && st.Context != nil {
		return st.Context.KeyMap
	}
	return nil
}

// parseContext gives a new entry the link and attributes of its sample's trace context.
// Only the first sample of an entry is parsed: the rest carry the same bytes.
func (a *Aggregator) parseContext(e *entry, img *image, s RawSample) {
	var attrs []Attribute
	var err error
	switch s.ContextKind {
	case ContextOTel:
		var r tracectx.Record
		r, err = tracectx.ParseRecord(s.Context, img.keyMap())
		e.link, attrs = r.Link, r.Attributes
		if r.UnknownKeys > 0 && img != nil {
			a.procs.refreshContext(img)
		}
	case ContextGoLabels:
		attrs, err = tracectx.ParseGoLabels(s.Context)
		if err == nil {
			e.link, attrs = tracectx.GoLink(attrs)
		}
	default:
		return
	}
	if err != nil {
		a.stats.ContextErrors++
		e.link, attrs = Link{}, nil
		return
	}
	slices.SortStableFunc(attrs, func(x, y Attribute) int { return cmp.Compare(x.Key, y.Key) })
	e.attrs = attrs
}
