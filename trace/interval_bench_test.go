package trace_test

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"
	"unsafe"

	"github.com/sonde-profiler/sonde/docs/encoding"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/trace"
)

// BenchmarkInterval is the agent's CPU per sample over whole intervals, chunk interning
// against a naive whole-stack map: every sample of an interval counted, the interval
// flushed into a Profile with each frame resolved to its mapping and location, and the
// Profile encoded into an OTLP request (dictionary, location and stack tables). The ns/op
// figure is one interval; ns/sample divides it by the interval's samples.
//
// Both agents are long-lived, as sonde is: the first interval, outside the timer, reads
// the processes and fills the chunk cache. Symbolizing, marshalling and compressing are
// left out: both agents hand them the same locations and the same request.
//
//	go test -run '^$' -bench BenchmarkInterval ./trace
func BenchmarkInterval(b *testing.B) {
	for _, st := range benchStreams(b) {
		b.Run(st.name+"/interned", func(b *testing.B) {
			c := st.collector(b)
			end := st.interval(c.Add, c.Flush, time.Unix(0, 0))
			for b.Loop() {
				end = st.interval(c.Add, c.Flush, end)
			}
			st.report(b)
		})
		b.Run(st.name+"/naive", func(b *testing.B) {
			a := st.naive()
			end := st.interval(a.add, a.flush, time.Unix(0, 0))
			for b.Loop() {
				end = st.interval(a.add, a.flush, end)
			}
			st.report(b)
		})
	}
}

// The baseline must count and resolve exactly what the collector does, or the benchmark
// compares different work.
func TestNaiveAgentAgreesWithAggregator(t *testing.T) {
	for _, st := range benchStreams(t) {
		var got, want *trace.Profile
		c := st.collector(t)
		st.interval(c.Add, func(end time.Time) *trace.Profile { got = c.Flush(end); return got }, time.Unix(0, 0))
		a := st.naive()
		st.interval(a.add, func(end time.Time) *trace.Profile { want = a.flush(end); return want }, time.Unix(0, 0))
		if g, w := profileCounts(got), profileCounts(want); !maps.Equal(g, w) {
			t.Errorf("%s: collector counts %d stacks, naive agent %d", st.name, len(g), len(w))
		}
		gr := otlp.Encode([]*trace.Profile{got}, benchHost, otlp.EncodeOptions{})
		wr := otlp.Encode([]*trace.Profile{want}, benchHost, otlp.EncodeOptions{})
		if g, w := len(gr.Dictionary.StackTable), len(wr.Dictionary.StackTable); g != w || g < 2 {
			t.Errorf("%s: %d stacks encoded from the collector, %d from the naive agent", st.name, g, w)
		}
		if g, w := len(gr.Dictionary.LocationTable), len(wr.Dictionary.LocationTable); g != w {
			t.Errorf("%s: %d locations encoded from the collector, %d from the naive agent", st.name, g, w)
		}
	}
}

var benchHost = otlp.Resource{HostName: "bench"}

// profileCounts keys each sample by process, thread and addresses.
func profileCounts(p *trace.Profile) map[string]int64 {
	out := map[string]int64{}
	for _, s := range p.Samples {
		addrs := make([]uint64, len(s.Locations))
		for i, l := range s.Locations {
			addrs[i] = l.Address
		}
		out[fmt.Sprint(s.Process.PID, s.TID, addrs)] += s.Count
	}
	return out
}

// intervalStream is one interval's samples in arrival order, and the executable mappings
// of the processes they come from.
type intervalStream struct {
	name     string
	samples  []trace.RawSample
	mappings map[uint32][]*trace.Mapping // by PID, sorted
	distinct int
	frames   int
}

// interval runs one interval through an agent and returns its end.
func (st *intervalStream) interval(add func(trace.RawSample), flush func(time.Time) *trace.Profile, start time.Time) time.Time {
	for _, s := range st.samples {
		add(s)
	}
	end := start.Add(10 * time.Second)
	otlp.Encode([]*trace.Profile{flush(end)}, benchHost, otlp.EncodeOptions{Version: "bench"})
	return end
}

func (st *intervalStream) report(b *testing.B) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(st.samples)), "ns/sample")
	b.ReportMetric(float64(len(st.samples)), "samples")
	b.ReportMetric(float64(st.distinct), "stacks")
	b.ReportMetric(float64(st.frames)/float64(len(st.samples)), "depth")
}

var benchKernel = &trace.Mapping{Start: trace.KernelStart, End: ^uint64(0), Path: "[kernel.kallsyms]"}

// collector returns an aggregator reading the stream's mappings from a proc directory of
// its own. The files are nowhere to be opened, so they are identified by inode only.
func (st *intervalStream) collector(tb testing.TB) *trace.Aggregator {
	tb.Helper()
	procfs := tb.TempDir()
	for pid, ms := range st.mappings {
		dir := filepath.Join(procfs, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		var lines []byte
		for i, m := range ms {
			lines = fmt.Appendf(lines, "%x-%x r-xp %08x 08:01 %d %s\n", m.Start, m.End, m.Offset, 1000+i, m.Path)
		}
		if err := os.WriteFile(filepath.Join(dir, "maps"), lines, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	procs := trace.NewProcesses(trace.ProcessConfig{ProcFS: procfs, OnFileError: func(string, error) {}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { procs.Run(ctx); close(done) }()
	tb.Cleanup(func() { cancel(); <-done })
	c, err := trace.NewAggregator(trace.Config{Kernel: benchKernel}, procs, time.Unix(0, 0))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func (st *intervalStream) naive() *naiveAgent {
	a := &naiveAgent{procs: map[uint32]*naiveProc{}, stacks: map[string]*naiveStack{}}
	for pid, ms := range st.mappings {
		a.procs[pid] = &naiveProc{proc: &trace.Process{PID: pid}, mappings: ms}
	}
	return a
}

// naiveAgent is what an agent without interning does: a map from each whole stack (with
// its process and thread) to a count, each distinct stack stored in full and resolved
// frame by frame when the interval is flushed.
type naiveAgent struct {
	procs  map[uint32]*naiveProc
	stacks map[string]*naiveStack
	key    []byte
	start  time.Time
}

type naiveProc struct {
	proc     *trace.Process
	mappings []*trace.Mapping
}

type naiveStack struct {
	proc   *naiveProc
	tid    uint32
	comm   string
	frames []uint64 // leaf first: kernel, then user
	count  int64
}

func (a *naiveAgent) add(s trace.RawSample) {
	a.key = binary.LittleEndian.AppendUint32(a.key[:0], s.PID)
	a.key = binary.LittleEndian.AppendUint32(a.key, s.TID)
	a.key = append(append(a.key, s.Comm...), 0)
	a.key = append(a.key, frameBytes(s.Kernel)...)
	a.key = append(a.key, 0xff) // kernel and user frames apart
	a.key = append(a.key, frameBytes(s.User)...)
	if st, ok := a.stacks[string(a.key)]; ok {
		st.count++
		return
	}
	proc := a.procs[s.PID]
	if proc == nil {
		proc = &naiveProc{proc: &trace.Process{PID: s.PID}}
		a.procs[s.PID] = proc
	}
	a.stacks[string(a.key)] = &naiveStack{
		proc: proc, tid: s.TID, comm: s.Comm, count: 1,
		frames: append(slices.Clone(s.Kernel), s.User...),
	}
}

func frameBytes(f []uint64) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), len(f)*8)
}

type naiveLocationKey struct {
	addr    uint64
	mapping *trace.Mapping
}

func (a *naiveAgent) flush(end time.Time) *trace.Profile {
	p := &trace.Profile{Start: a.start, End: end}
	locs := map[naiveLocationKey]*trace.Location{}
	for _, st := range a.stacks {
		s := &trace.Sample{Process: st.proc.proc, TID: st.tid, ThreadName: st.comm, Count: st.count,
			Locations: make([]*trace.Location, len(st.frames))}
		for i, addr := range st.frames {
			kind, m := trace.FrameNative, benchKernel
			if addr >= benchKernel.Start {
				kind = trace.FrameKernel
			} else {
				m = findMapping(st.proc.mappings, addr)
			}
			k := naiveLocationKey{addr, m}
			l, ok := locs[k]
			if !ok {
				l = &trace.Location{Kind: kind, Address: addr, Mapping: m}
				locs[k] = l
				p.Locations = append(p.Locations, l)
			}
			s.Locations[i] = l
		}
		p.Samples = append(p.Samples, s)
	}
	clear(a.stacks)
	a.start = end
	return p
}

func findMapping(ms []*trace.Mapping, addr uint64) *trace.Mapping {
	i := sort.Search(len(ms), func(i int) bool { return ms[i].End > addr })
	if i < len(ms) && ms[i].Start <= addr {
		return ms[i]
	}
	return nil
}

// benchStreams are the synthetic stacks of BenchmarkAggregate at depths 15 and 120, ten
// samples per distinct stack, and the three captured corpora of the encoding study
// replayed in the order they were taken.
func benchStreams(tb testing.TB) []*intervalStream {
	tb.Helper()
	var out []*intervalStream
	for _, depth := range []int{15, 120} {
		stacks := trace.BenchStacks(2000, depth)
		st := &intervalStream{
			name:     fmt.Sprintf("depth%d", depth),
			mappings: map[uint32][]*trace.Mapping{1: {{Start: 0x400000, End: 0x800000, Path: "/bench/app"}}},
			distinct: len(stacks),
		}
		r := rand.New(rand.NewPCG(3, 4))
		for range 10 * len(stacks) {
			s := stacks[r.IntN(len(stacks))]
			st.samples = append(st.samples, trace.RawSample{PID: 1, TID: 1, Comm: "app", User: s})
			st.frames += len(s)
		}
		out = append(out, st)
	}
	for _, name := range []string{"average", "deep", "large"} {
		c, err := encoding.Load("../docs/encoding/testdata/" + name + ".otlp.pb.gz")
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, corpusStream(c))
	}
	return out
}

// corpusStream replays a captured corpus: each timestamp one sample, in time order.
func corpusStream(c *encoding.Corpus) *intervalStream {
	st := &intervalStream{name: c.Name, mappings: map[uint32][]*trace.Mapping{}, distinct: len(c.Samples)}
	seen := map[uint32]map[int32]bool{}
	type timed struct {
		at uint64
		s  trace.RawSample
	}
	var all []timed
	for _, cs := range c.Samples {
		var kernel, user []uint64
		for _, li := range cs.Stack {
			loc := c.Dict.LocationTable[li]
			if loc.Address >= benchKernel.Start {
				kernel = append(kernel, loc.Address)
				continue
			}
			user = append(user, loc.Address)
			if seen[cs.PID] == nil {
				seen[cs.PID] = map[int32]bool{}
			}
			if mi := loc.MappingIndex; mi > 0 && !seen[cs.PID][mi] {
				seen[cs.PID][mi] = true
				m := c.Dict.MappingTable[mi]
				st.mappings[cs.PID] = append(st.mappings[cs.PID], &trace.Mapping{
					Start: m.MemoryStart, End: m.MemoryLimit, Offset: m.FileOffset,
					Path: "/bench" + c.Dict.StringTable[m.FilenameStrindex],
				})
			}
		}
		s := trace.RawSample{PID: cs.PID, TID: cs.TID, Comm: "corpus", Kernel: kernel, User: user}
		for _, at := range cs.Times {
			all = append(all, timed{at, s})
			st.frames += len(kernel) + len(user)
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].at < all[j].at })
	for _, t := range all {
		st.samples = append(st.samples, t.s)
	}
	for _, ms := range st.mappings {
		slices.SortFunc(ms, func(a, b *trace.Mapping) int { return cmp.Compare(a.Start, b.Start) })
	}
	return st
}
