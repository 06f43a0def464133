// Package fakeruntime_test holds a language runtime of its own, host side only, to show
// that a runtime plugs into sonde through the seam alone: registered with the aggregator
// and the symbolizer, its frames (injected as its kernel walker would write them) come out
// of every output under its own kind name, with no change to any other package.
package fakeruntime_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/reporter/flame"
	"github.com/sonde-profiler/sonde/reporter/folded"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/reporter/pprof"
	"github.com/sonde-profiler/sonde/symbolize"
	"github.com/sonde-profiler/sonde/trace"
)

// The runtime's number, as its kernel walker would write it, and its frame type.
const (
	number    = 11
	frameType = "fakelang"
)

// runtime packs an 8-byte aligned code address above a 14-bit offset, and names code
// "fn_<address>" in "script.fake", the offset being the line.
type runtime struct {
	mu   sync.Mutex
	seen map[uint64]int
}

func (r *runtime) FrameType() string { return frameType }

func (r *runtime) DecodeFrame(payload uint64) (uint64, uint32) {
	return payload >> 14 << 3, uint32(payload & (1<<14 - 1))
}

func (r *runtime) SeenCode(pid uint32, image, code uint64) {
	r.mu.Lock()
	r.seen[code]++
	r.mu.Unlock()
}

func (r *runtime) Name(loc *trace.Location) ([]trace.Line, bool) {
	if loc.Interp == nil {
		return nil, false
	}
	name := fmt.Sprintf("fn_%x", loc.Interp.Code)
	return []trace.Line{{Function: name, SystemName: name, File: "script.fake", Line: int64(loc.Interp.Offset)}}, true
}

func frame(code uint64, offset uint32) uint64 {
	return trace.EncodeInterpFrame(number, code>>3<<14|uint64(offset))
}

//go:noinline
func hostLeaf() int { return 1 }

//go:noinline
func hostRoot() int { return hostLeaf() + 1 }

// TestFakeRuntimeEverywhere: a stack of this process, native (Go) frames around two of the
// runtime's, flows through aggregation, naming, OTLP, pprof, folded and the flame graphs.
func TestFakeRuntimeEverywhere(t *testing.T) {
	rt := &runtime{seen: map[uint64]int{}}
	procs := trace.NewProcesses(trace.ProcessConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { procs.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	start := time.Now()
	agg, err := trace.NewAggregator(trace.Config{Period: 10 * time.Millisecond, Runtimes: trace.Runtimes{number: rt}}, procs, start)
	if err != nil {
		t.Fatal(err)
	}

	const codeInner, codeOuter = 0x7f00_0000_1008, 0x7f00_0000_2010
	leaf := uint64(reflect.ValueOf(hostLeaf).Pointer()) + 1
	root := uint64(reflect.ValueOf(hostRoot).Pointer()) + 1
	stack := []uint64{leaf, frame(codeInner, 12), frame(codeOuter, 34), root}
	pid := uint32(os.Getpid())
	for range 5 {
		agg.Add(trace.RawSample{PID: pid, TID: pid, Time: start.Add(time.Millisecond), Comm: "fakelang", User: stack})
	}
	p := agg.Flush(start.Add(time.Second))
	if rt.seen[codeInner] != 1 || rt.seen[codeOuter] != 1 {
		t.Errorf("the runtime heard of its code %v, want each once", rt.seen)
	}

	sym := symbolize.New(symbolize.Options{Runtimes: map[uint8]symbolize.InterpNamer{number: rt}})
	if errs := sym.Symbolize(p); len(errs) > 0 {
		t.Logf("symbolize: %v", errs)
	}
	if len(p.Samples) != 1 || p.Samples[0].Count != 5 || len(p.Samples[0].Locations) != 4 {
		t.Fatalf("samples %+v", p.Samples)
	}
	inner := p.Samples[0].Locations[1]
	if inner.Kind != trace.FrameInterp || inner.KindName() != frameType || inner.NameSource != frameType ||
		len(inner.Lines) != 1 || inner.Lines[0].Function != "fn_7f0000001008" || inner.Lines[0].Line != 12 {
		t.Fatalf("the runtime's inner frame: %+v lines %+v", inner, inner.Lines)
	}
	if l := p.Samples[0].Locations[0]; l.KindName() != "go" || len(l.Lines) == 0 || !strings.HasSuffix(l.Lines[0].Function, "hostLeaf") {
		t.Errorf("the native leaf around it: %+v lines %+v", l, l.Lines)
	}
	want := []string{"fn_7f0000002010", "fn_7f0000001008"} // root first

	t.Run("otlp", func(t *testing.T) {
		req := otlp.Encode([]*trace.Profile{p}, otlp.Resource{HostName: "test"}, otlp.EncodeOptions{})
		bin, err := proto.Marshal(&profilespb.ProfilesData{ResourceProfiles: req.ResourceProfiles, Dictionary: req.Dictionary})
		if err != nil {
			t.Fatal(err)
		}
		back, err := otlp.Decode(bin, false)
		if err != nil || len(back) != 1 || len(back[0].Samples) != 1 {
			t.Fatalf("decoded %v, %v", back, err)
		}
		l := back[0].Samples[0].Locations[1]
		if l.KindName() != frameType || l.NameSource != frameType || len(l.Lines) != 1 || l.Lines[0].Function != "fn_7f0000001008" {
			t.Errorf("decoded frame: kind %q source %q lines %+v", l.KindName(), l.NameSource, l.Lines)
		}
	})
	t.Run("pprof", func(t *testing.T) {
		var b bytes.Buffer
		if err := pprof.Write(&b, p); err != nil {
			t.Fatal(err)
		}
		back, err := pprof.Read(&b)
		if err != nil || len(back.Samples) != 1 {
			t.Fatalf("read back %v, %v", back, err)
		}
		var names []string
		for _, l := range back.Samples[0].Locations {
			for _, ln := range l.Lines {
				names = append(names, ln.Function)
			}
		}
		if got := strings.Join(names, ";"); !strings.Contains(got, "fn_7f0000001008;fn_7f0000002010") {
			t.Errorf("pprof frames %s", got)
		}
	})
	t.Run("folded", func(t *testing.T) {
		var b bytes.Buffer
		if err := folded.Write(&b, p); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), strings.Join(want, ";")) {
			t.Errorf("folded:\n%s", b.String())
		}
	})
	t.Run("flame", func(t *testing.T) {
		tree := flame.NewTree(p)
		var kinds []string
		var walk func(n *flame.Node)
		walk = func(n *flame.Node) {
			if strings.HasPrefix(n.Name, "fn_") {
				kinds = append(kinds, n.Kind)
			}
			for _, c := range n.Children {
				walk(c)
			}
		}
		walk(tree.Root)
		if fmt.Sprint(kinds) != "[fakelang fakelang]" {
			t.Errorf("flame tree kinds of the runtime's frames %v", kinds)
		}
		var html, svg bytes.Buffer
		if err := flame.WriteHTML(&html, p, flame.FactsFrom(p)); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(html.String(), `"fakelang"`) || !strings.Contains(html.String(), "fn_7f0000001008") {
			t.Error("the page lists neither the runtime's kind nor its frame")
		}
		if err := flame.WriteSVG(&svg, p, flame.FactsFrom(p)); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(svg.String(), "fn_7f0000001008") {
			t.Error("the SVG lacks the runtime's frame")
		}
	})
}
