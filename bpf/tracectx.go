package bpf

import (
	"errors"
	"fmt"
	"log/slog"
	"unsafe"

	"github.com/cilium/ebpf"
)

// ContextSource says who published a sample's trace context.
type ContextSource uint8

const (
	ContextNone ContextSource = ContextSource(samplerCtxSourceCTX_NONE)
	// ContextOTel: Data is an OpenTelemetry thread context record (OTEP 4947), its
	// 28-byte header and attrs-data as the process published them.
	ContextOTel = ContextSource(samplerCtxSourceCTX_OTEL)
	// ContextGoLabels: Data is a goroutine's pprof labels, each a key length byte, a
	// value length byte, the key and the value.
	ContextGoLabels = ContextSource(samplerCtxSourceCTX_GO_LABELS)
)

// Bounds the kernel keeps to when it copies a context (types.h).
const (
	// MaxContextBytes bounds a sample's context: an OpenTelemetry record longer than
	// this, header included, is counted and ignored; Go labels past it are cut.
	MaxContextBytes = 640 // TRACECTX_DATA_MAX
	// OTelRecordHeader is the fixed part of an OpenTelemetry thread context record.
	OTelRecordHeader = 28
	// MaxGoLabels, MaxGoLabelKey and MaxGoLabelValue bound the Go labels of a sample:
	// labels past the first MaxGoLabels, and bytes past those lengths, are cut and counted.
	MaxGoLabels     = 16
	MaxGoLabelKey   = 64
	MaxGoLabelValue = 128
)

// TLSModel says where a process's otel_thread_ctx_v1 is for a thread.
type TLSModel uint8

const (
	TLSNone = TLSModel(samplerTlsModelTLS_NONE)
	// TLSStatic: at the thread pointer plus TLSOffset.
	TLSStatic = TLSModel(samplerTlsModelTLS_STATIC)
	// TLSDTV: at the thread's DTV entry TLSModule plus TLSOffset.
	TLSDTV = TLSModel(samplerTlsModelTLS_DTV)
)

// GoLabelsLayout says how a Go runtime keeps a goroutine's labels.
type GoLabelsLayout uint8

const (
	GoLabelsNone  = GoLabelsLayout(samplerGoLabelsLayoutGO_LABELS_NONE)
	GoLabelsSlice = GoLabelsLayout(samplerGoLabelsLayoutGO_LABELS_SLICE) // Go 1.24 on
	GoLabelsMap   = GoLabelsLayout(samplerGoLabelsLayoutGO_LABELS_MAP)   // before
)

// TraceContextProc tells the kernel where a process publishes its threads' trace context.
type TraceContextProc struct {
	// ExecID is the exec the offsets were read for; the kernel ignores them after another.
	ExecID uint64

	// The OpenTelemetry thread context: TLSNone, or where otel_thread_ctx_v1 is.
	TLS       TLSModel
	TLSOffset int64
	TLSModule uint64
	// With TLSDTV: the DTV pointer is at the thread pointer plus DTVOffset, its entries
	// are 1<<DTVShift bytes, and its entry DTVLen (when not 0) holds its length.
	DTVOffset int32
	DTVLen    int32
	DTVShift  uint8

	// Go labels: the layout, where the running g is from the thread pointer, and the
	// offsets of g.m, m.curg and g.labels.
	GoLayout                 GoLabelsLayout
	GoGOffset                int32
	GoGM, GoMCurg, GoGLabels uint32
}

// SetTraceContext tells the kernel where pid publishes its trace context.
func (s *Sampler) SetTraceContext(pid uint32, p TraceContextProc) error {
	v := samplerTracectxProc{
		ExecId: p.ExecID, TlsOffset: p.TLSOffset, TlsModule: p.TLSModule, DtvOffset: p.DTVOffset, DtvLen: p.DTVLen,
		TlsModel: uint8(p.TLS), DtvShift: p.DTVShift, GoLayout: uint8(p.GoLayout),
		GoG_offset: p.GoGOffset, GoG_m: p.GoGM, GoM_curg: p.GoMCurg, GoG_labels: p.GoGLabels,
	}
	if err := s.objs.TracectxProcs.Put(pid, &v); err != nil {
		return fmt.Errorf("set trace context of pid %d: %w", pid, err)
	}
	return nil
}

// DeleteTraceContext forgets where pid publishes its trace context.
func (s *Sampler) DeleteTraceContext(pid uint32) error {
	if err := s.objs.TracectxProcs.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete trace context of pid %d: %w", pid, err)
	}
	return nil
}

// ContextCounters count, summed over CPUs, the trace contexts the kernel read and why it
// ignored others.
type ContextCounters struct {
	OTel, GoLabels uint64
	// Invalid records (valid byte not 1, misaligned), Oversized ones (over
	// MaxContextBytes) and Torn ones (changed while copied) are ignored.
	Invalid, Oversized, Torn uint64
	// ReadErrors are reads of the process's memory that failed; GoTruncated label sets
	// cut to the bounds; Stale samples of a process that exec'd since it was described;
	// RingBufferFull contexts lost for want of room.
	ReadErrors, GoTruncated, Stale, RingBufferFull uint64
	// With Config.CollectStats: the samples that looked for a context, and the time
	// the looking took in all, whether it found one or not.
	Calls       uint64
	Nanoseconds uint64
}

func (s *Sampler) contextCounters() (ContextCounters, error) {
	var out ContextCounters
	fields := [samplerTracectxCounterTRACECTX_COUNTER_MAX]*uint64{
		samplerTracectxCounterTRACECTX_OTEL:         &out.OTel,
		samplerTracectxCounterTRACECTX_GO_LABELS:    &out.GoLabels,
		samplerTracectxCounterTRACECTX_INVALID:      &out.Invalid,
		samplerTracectxCounterTRACECTX_OVERSIZED:    &out.Oversized,
		samplerTracectxCounterTRACECTX_TORN:         &out.Torn,
		samplerTracectxCounterTRACECTX_READ_ERROR:   &out.ReadErrors,
		samplerTracectxCounterTRACECTX_GO_TRUNCATED: &out.GoTruncated,
		samplerTracectxCounterTRACECTX_STALE:        &out.Stale,
		samplerTracectxCounterTRACECTX_RINGBUF_FULL: &out.RingBufferFull,
		samplerTracectxCounterTRACECTX_CALLS:        &out.Calls,
		samplerTracectxCounterTRACECTX_NS:           &out.Nanoseconds,
	}
	for i, field := range fields {
		if field == nil {
			continue
		}
		v, err := perCPUSum(s.objs.TracectxCounters, uint32(i))
		if err != nil {
			return out, fmt.Errorf("read trace context counter %d: %w", i, err)
		}
		*field += v
	}
	return out, nil
}

// LogValue names the counters as the summary does.
func (c ContextCounters) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Uint64("otel", c.OTel), slog.Uint64("go_labels", c.GoLabels), slog.Uint64("invalid", c.Invalid),
		slog.Uint64("oversized", c.Oversized), slog.Uint64("torn", c.Torn), slog.Uint64("read_errors", c.ReadErrors),
		slog.Uint64("go_truncated", c.GoTruncated), slog.Uint64("stale", c.Stale), slog.Uint64("ring_buffer_full", c.RingBufferFull),
		slog.Uint64("ns_per_sample", c.NanosecondsPerCall()))
}

// NanosecondsPerCall is what looking for a context cost a sample on average, with
// Config.CollectStats; 0 without.
func (c ContextCounters) NanosecondsPerCall() uint64 {
	if c.Calls == 0 {
		return 0
	}
	return c.Nanoseconds / c.Calls
}

// pendingContext is the context record a CPU sent for the sample it sends next.
type pendingContext struct {
	ktime  uint64
	source ContextSource
	data   []byte
}

// maxContextCPUs bounds the CPUs whose pending contexts are kept: CPU numbers come from
// the kernel, but a slice indexed by them must not grow without bound.
const maxContextCPUs = 1 << 14

// contextHeaderSize is where a context record's data begins.
var contextHeaderSize = int(unsafe.Offsetof(samplerTracectxEvent{}.Data))

// holdContext keeps a context record until the sample it belongs to arrives.
func (s *Sampler) holdContext(raw []byte) {
	if len(raw) < contextHeaderSize {
		return
	}
	e := (*samplerTracectxEvent)(unsafe.Pointer(&raw[0]))
	if e.Cpu >= maxContextCPUs {
		return
	}
	for int(e.Cpu) >= len(s.pending) {
		s.pending = append(s.pending, pendingContext{})
	}
	n := min(int(e.Len), len(raw)-contextHeaderSize, MaxContextBytes)
	p := &s.pending[e.Cpu]
	p.ktime, p.source = e.KtimeNs, ContextSource(e.Source)
	p.data = append(p.data[:0], raw[contextHeaderSize:contextHeaderSize+n]...)
}

// takeContext hands a sample the context its CPU sent just before it, if that was its.
func (s *Sampler) takeContext(cpu uint32, ktime uint64) (ContextSource, []byte) {
	if int(cpu) >= len(s.pending) {
		return ContextNone, nil
	}
	p := &s.pending[cpu]
	if p.source == ContextNone || p.ktime != ktime {
		return ContextNone, nil
	}
	src := p.source
	p.source = ContextNone
	return src, p.data
}
