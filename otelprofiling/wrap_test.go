package otelprofiling

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// goroutineLabels returns the labels of the calling goroutine, as a profile of it shows.
func goroutineLabels(t *testing.T) map[string]string {
	t.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		t.Fatal(err)
	}
	// The debug=1 format lists, for each group of goroutines, its labels as
	// `# labels: {"k":"v", ...}` after its count; the caller's stack names this function.
	var labels string
	for _, block := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(block, "goroutineLabels") {
			for _, line := range strings.Split(block, "\n") {
				if rest, ok := strings.CutPrefix(line, "# labels: "); ok {
					labels = rest
				}
			}
		}
	}
	out := map[string]string{}
	for _, kv := range strings.Split(strings.Trim(labels, "{}"), ", ") {
		if k, v, ok := strings.Cut(kv, ":"); ok {
			out[strings.Trim(k, `"`)] = strings.Trim(v, `"`)
		}
	}
	return out
}

// A span labels its goroutine with its IDs; a child span with its own; each End gives the
// goroutine the labels it had before the span started.
func TestSpanLabelsTheGoroutine(t *testing.T) {
	tp := Wrap(sdktrace.NewTracerProvider(), nil)
	tr := tp.Tracer("test")
	base := pprof.WithLabels(context.Background(), pprof.Labels("route", "/x"))
	pprof.SetGoroutineLabels(base)
	defer pprof.SetGoroutineLabels(context.Background())

	ctx, outer := tr.Start(base, "outer")
	got := goroutineLabels(t)
	if got[LabelSpanID] != outer.SpanContext().SpanID().String() || got[LabelTraceID] != outer.SpanContext().TraceID().String() || got["route"] != "/x" {
		t.Fatalf("in the outer span: %v", got)
	}
	_, inner := tr.Start(ctx, "inner")
	if got := goroutineLabels(t); got[LabelSpanID] != inner.SpanContext().SpanID().String() {
		t.Errorf("in the inner span: %v", got)
	}
	inner.End()
	if got := goroutineLabels(t); got[LabelSpanID] != outer.SpanContext().SpanID().String() {
		t.Errorf("after the inner span: %v, want the outer span's", got)
	}
	outer.End()
	if got := goroutineLabels(t); got[LabelSpanID] != "" || got["route"] != "/x" {
		t.Errorf("after both: %v, want the labels from before", got)
	}
	// A provider whose spans are invalid labels nothing.
	_, span := Wrap(noop.NewTracerProvider(), nil).Tracer("test").Start(context.Background(), "none")
	if got := goroutineLabels(t); got[LabelSpanID] != "" {
		t.Errorf("an invalid span labelled the goroutine: %v", got)
	}
	span.End()
	var _ trace.TracerProvider = tp
}

// Wrap publishes the resource as an OTEP 4719 process context: a mapping named OTEL_CTX
// whose header points at a payload holding the resource and the schema.
func TestWrapPublishesProcessContext(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the process context is Linux's")
	}
	res := resource.NewSchemaless(attribute.String("service.name", "unit-svc"), attribute.Int("build", 7))
	Wrap(sdktrace.NewTracerProvider(), res)
	addr := contextMapping(t)
	h := readMemory(t, addr, headerSize)
	if string(h[:8]) != "OTEL_CTX" || binary.NativeEndian.Uint32(h[8:]) != headerVersion || binary.NativeEndian.Uint64(h[16:]) == 0 {
		t.Fatalf("header %q", h)
	}
	first := binary.NativeEndian.Uint64(h[16:])
	size, ptr := binary.NativeEndian.Uint32(h[12:]), binary.NativeEndian.Uint64(h[24:])
	payload := readMemory(t, ptr, int(size))
	for _, want := range []string{"service.name", "unit-svc", "threadlocal.schema_version", Schema} {
		if !bytes.Contains(payload, []byte(want)) {
			t.Errorf("payload lacks %q: %q", want, payload)
		}
	}
	// Wrapping again updates the one context: a new timestamp, the same mapping.
	Wrap(sdktrace.NewTracerProvider(), resource.NewSchemaless(attribute.String("service.name", "renamed")))
	h = readMemory(t, addr, headerSize)
	if contextMapping(t) != addr || binary.NativeEndian.Uint64(h[16:]) == first {
		t.Errorf("update: mapping %#x (was %#x), timestamp %d (was %d)", contextMapping(t), addr, binary.NativeEndian.Uint64(h[16:]), first)
	}
}

// readMemory reads this process's memory as another process would, through /proc.
func readMemory(t *testing.T, addr uint64, n int) []byte {
	t.Helper()
	f, err := os.Open("/proc/self/mem")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, int64(addr)); err != nil {
		t.Fatalf("read %d bytes at %#x: %v", n, addr, err)
	}
	return b
}

// contextMapping finds the process context in this process's maps, as a reader does.
func contextMapping(t *testing.T) uint64 {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var found []uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 6 && strings.Contains(strings.Join(fields[5:], " "), "OTEL_CTX") {
			start, _, _ := strings.Cut(fields[0], "-")
			v, err := strconv.ParseUint(start, 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d OTEL_CTX mappings, want one", len(found))
	}
	return found[0]
}
