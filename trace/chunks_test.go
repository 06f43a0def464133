package trace

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"
)

func TestChunkBounds(t *testing.T) {
	for _, tc := range []struct {
		n, size int
		want    [][2]int
	}{
		{0, 4, nil},
		{3, 4, [][2]int{{0, 3}}},                   // shorter than a chunk
		{4, 4, [][2]int{{0, 4}}},                   // exactly one
		{8, 4, [][2]int{{4, 8}, {0, 4}}},           // a multiple
		{10, 4, [][2]int{{6, 10}, {2, 6}, {0, 2}}}, // root chunks full, leaf chunk short
	} {
		if got := chunkBounds(tc.n, tc.size, nil); !slices.Equal(got, tc.want) {
			t.Errorf("chunkBounds(%d, %d) = %v, want %v", tc.n, tc.size, got, tc.want)
		}
	}
}

// Stacks that share a root-side prefix share its chunks, whatever their leaves.
func TestChunksShareRootPrefix(t *testing.T) {
	c := newTestAggregator(t, 4, 1024)
	prefix := []uint64{0x1008, 0x1007, 0x1006, 0x1005, 0x1004, 0x1003, 0x1002, 0x1001} // leaf first
	c.Add(RawSample{PID: 1, TID: 1, User: append([]uint64{0x2001}, prefix...)})
	c.Add(RawSample{PID: 1, TID: 1, User: append([]uint64{0x3001, 0x3002}, prefix...)})
	st := c.Stats()
	// Root chunks (8 frames) are shared: 2 of them, plus one leaf chunk each.
	if st.Traces != 2 || st.Chunks != 4 {
		t.Errorf("2 stacks over a shared 8-frame prefix: %d traces, %d chunks; want 2 and 4", st.Traces, st.Chunks)
	}
}

func newTestAggregator(t testing.TB, size, capacity int) *Aggregator {
	t.Helper()
	c, _ := newAggregator(t, ProcessConfig{ProcFS: t.TempDir()}, Config{ChunkSize: size, ChunkCapacity: capacity}, time.Unix(0, 0))
	return c
}

// stackKey renders a profile sample's identity for comparison with the naive count.
func stackKey(tid uint32, addrs []uint64) string {
	return fmt.Sprint(tid, addrs)
}

func counts(p *Profile) map[string]int64 {
	out := map[string]int64{}
	for _, s := range p.Samples {
		addrs := make([]uint64, len(s.Locations))
		for i, l := range s.Locations {
			addrs[i] = l.Address
		}
		out[stackKey(s.TID, addrs)] += s.Count
	}
	return out
}

// randomStack draws from a tree of stacks: a few roots, shared middles, varied leaves, and
// depths around and across chunk boundaries.
func randomStack(r *rand.Rand) (tid uint32, kernel, user []uint64) {
	depth := 1 + r.IntN(40)
	user = make([]uint64, depth)
	root := uint64(r.IntN(3))
	for i := range depth { // from the root
		branch := uint64(0)
		if i > depth-4 {
			branch = uint64(r.IntN(5))
		}
		user[depth-1-i] = 0x400000 + root<<20 + uint64(i)<<8 + branch
	}
	if r.IntN(4) == 0 {
		kernel = []uint64{0xffffffff81000000 + uint64(r.IntN(3))*16, 0xffffffff81001000}
	}
	return uint32(1 + r.IntN(2)), kernel, user
}

// Interning must never change what is counted: every flushed stack and count equals a
// naive whole-stack count, also when a tiny cache evicts chunks that live stacks still use.
func TestInterningMatchesNaiveUnderEviction(t *testing.T) {
	for _, capacity := range []int{1, 3, 64, 4096} {
		for _, size := range []int{1, 3, 8} {
			r := rand.New(rand.NewPCG(uint64(capacity), uint64(size)))
			c := newTestAggregator(t, size, capacity)
			for interval := range 4 {
				naive := map[string]int64{}
				for range 3000 {
					tid, kernel, user := randomStack(r)
					c.Add(RawSample{PID: 7, TID: tid, Comm: "w", User: user, Kernel: kernel})
					naive[stackKey(tid, append(slices.Clone(kernel), user...))]++
				}
				got := counts(c.Flush(time.Unix(int64(interval+1), 0)))
				if len(got) != len(naive) {
					t.Fatalf("size %d capacity %d interval %d: %d distinct stacks, naive count has %d", size, capacity, interval, len(got), len(naive))
				}
				for k, n := range naive {
					if got[k] != n {
						t.Fatalf("size %d capacity %d: stack %s counted %d, want %d", size, capacity, k, got[k], n)
					}
				}
			}
			if st := c.Stats(); capacity == 1 && st.ChunkEvictions == 0 {
				t.Errorf("capacity 1 saw no eviction: %+v", st)
			}
		}
	}
}

// naiveAggregator is the baseline the issue measures against: a map from the whole stack
// (and thread) to its count, each distinct stack stored in full.
type naiveAggregator struct {
	m   map[string]*naiveEntry
	buf []byte
}

type naiveEntry struct {
	frames []uint64
	count  int64
}

func (a *naiveAggregator) add(tid uint32, frames []uint64) {
	a.buf = append(a.buf[:0], byte(tid), byte(tid>>8), byte(tid>>16), byte(tid>>24))
	a.buf = append(a.buf, unsafe.Slice((*byte)(unsafe.Pointer(&frames[0])), len(frames)*8)...)
	if e, ok := a.m[string(a.buf)]; ok {
		e.count++
		return
	}
	a.m[string(a.buf)] = &naiveEntry{frames: slices.Clone(frames), count: 1}
}

// benchStacks makes n distinct stacks of the given depth shaped like a real program's:
// a common start-up prefix, a handful of request paths, and leaves that differ.
func benchStacks(n, depth int) [][]uint64 {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([][]uint64, n)
	for i := range out {
		s := make([]uint64, depth)
		path := uint64(r.IntN(8))
		for j := range depth { // j counts from the root
			switch {
			case j < depth/2:
				s[depth-1-j] = 0x400000 + uint64(j)*16
			case j < depth-3:
				s[depth-1-j] = 0x500000 + path<<12 + uint64(j)*16
			default:
				s[depth-1-j] = 0x600000 + uint64(i)<<8 + uint64(j)
			}
		}
		out[i] = s
	}
	return out
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkAggregate compares chunk interning with the naive whole-stack map: CPU per sample
// (ns/op, each op one sample, most of them repeats of stacks already seen) and the memory
// each distinct stack costs (B/trace, the interval's trace table included).
func BenchmarkAggregate(b *testing.B) {
	const distinct = 2000
	for _, depth := range []int{15, 120} {
		stacks := benchStacks(distinct, depth)
		b.Run(fmt.Sprintf("depth%d/interned", depth), func(b *testing.B) {
			before := heapInUse()
			c := newTestAggregator(b, DefaultChunkSize, 8192)
			for _, s := range stacks {
				c.Add(RawSample{PID: 1, TID: 1, User: s})
			}
			perTrace := float64(heapInUse()-before) / distinct
			// The aggregation step alone: the lock and the process lookup cost the same
			// whatever the aggregation, and the naive baseline has neither. A repeat does
			// not check its addresses against the mappings: BenchmarkInterval measures
			// the whole path, flush and encoding included.
			img := c.image(RawSample{PID: 1, TID: 1})
			i := 0
			for b.Loop() {
				c.aggregate(img, RawSample{PID: 1, TID: 1, User: stacks[i%distinct]})
				i++
			}
			b.ReportMetric(perTrace, "B/trace")
			runtime.KeepAlive(c)
		})
		b.Run(fmt.Sprintf("depth%d/naive", depth), func(b *testing.B) {
			before := heapInUse()
			a := &naiveAggregator{m: map[string]*naiveEntry{}}
			for _, s := range stacks {
				a.add(1, s)
			}
			perTrace := float64(heapInUse()-before) / distinct
			i := 0
			for b.Loop() {
				a.add(1, stacks[i%distinct])
				i++
			}
			b.ReportMetric(perTrace, "B/trace")
			runtime.KeepAlive(a)
		})
	}
}

// Trace IDs keep apart what the entry key keeps apart: threads, thread names and address
// spaces; and the table holds every stack of a large interval, then starts empty.
func TestTraceIDsKeepEntriesApart(t *testing.T) {
	c := newTestAggregator(t, DefaultChunkSize, 1<<12)
	stack := []uint64{0x1010, 0x1020, 0x1030}
	c.Add(RawSample{PID: 1, TID: 1, Comm: "a", User: stack})
	c.Add(RawSample{PID: 1, TID: 1, Comm: "b", User: stack}) // renamed
	c.Add(RawSample{PID: 1, TID: 2, Comm: "a", User: stack})
	c.Add(RawSample{PID: 2, TID: 1, Comm: "a", User: stack}) // another address space
	c.Add(RawSample{PID: 1, TID: 1, Comm: "a", User: stack})
	want := map[string]int64{"1 1 a": 2, "1 1 b": 1, "1 2 a": 1, "2 1 a": 1}
	got := map[string]int64{}
	for _, s := range c.Flush(time.Unix(1, 0)).Samples {
		got[fmt.Sprintf("%d %d %s", s.Process.PID, s.TID, s.ThreadName)] += s.Count
	}
	if !maps.Equal(got, want) {
		t.Errorf("entries %v, want %v", got, want)
	}

	const distinct = 20000 // many times the table's first size: it grows while counting
	for round := range 3 {
		for i := range distinct {
			c.Add(RawSample{PID: 1, TID: 1, Comm: "a", User: []uint64{uint64(i)<<4 | 0x100000, 0x1020}})
		}
		if round == 1 {
			if n := c.Stats().Traces; n != distinct {
				t.Fatalf("%d traces after two rounds over %d stacks", n, distinct)
			}
		}
	}
	p := c.Flush(time.Unix(2, 0))
	if len(p.Samples) != distinct {
		t.Fatalf("%d samples, want %d", len(p.Samples), distinct)
	}
	for _, s := range p.Samples {
		if s.Count != 3 {
			t.Fatalf("stack %#x counted %d times, want 3", s.Locations[0].Address, s.Count)
		}
	}
	if n := len(c.Flush(time.Unix(3, 0)).Samples); n != 0 {
		t.Errorf("%d samples in an interval with none", n)
	}
}

// A cached chunk is resolved once: later intervals report the very same locations, each
// profile lists every location its samples use exactly once, and evicted chunks give
// their locations up, so the locations held stay within what the cache can hold.
func TestLocationsOutliveIntervals(t *testing.T) {
	const size, capacity = 4, 64
	c := newTestAggregator(t, size, capacity)
	shared := []uint64{0x1040, 0x1030, 0x1020, 0x1010} // one root chunk
	c.Add(RawSample{PID: 1, TID: 1, User: append([]uint64{0x2010}, shared...)})
	c.Add(RawSample{PID: 1, TID: 1, User: append([]uint64{0x2020, 0x1030}, shared...)}) // 0x1030 twice
	first := c.Flush(time.Unix(1, 0))
	c.Add(RawSample{PID: 1, TID: 1, User: append([]uint64{0x2010}, shared...)})
	second := c.Flush(time.Unix(2, 0))

	byAddr := func(p *Profile) map[uint64]*Location {
		listed := map[*Location]bool{}
		out := map[uint64]*Location{}
		for _, l := range p.Locations {
			if listed[l] {
				t.Fatalf("location %#x listed twice", l.Address)
			}
			listed[l] = true
		}
		for _, s := range p.Samples {
			for _, l := range s.Locations {
				if !listed[l] {
					t.Fatalf("sample uses location %#x the profile does not list", l.Address)
				}
				if have, ok := out[l.Address]; ok && have != l {
					t.Fatalf("address %#x has two locations in one profile", l.Address)
				}
				out[l.Address] = l
			}
		}
		return out
	}
	one, two := byAddr(first), byAddr(second)
	if len(one) != 6 || len(two) != 5 || len(second.Locations) != 5 {
		t.Fatalf("%d and %d locations (%d listed); want 6 and 5", len(one), len(two), len(second.Locations))
	}
	for addr, l := range two {
		if one[addr] != l {
			t.Errorf("address %#x resolved again in the second interval", addr)
		}
	}

	r := rand.New(rand.NewPCG(5, 6))
	for range 5 {
		for range 2000 {
			_, kernel, user := randomStack(r)
			c.Add(RawSample{PID: 1, TID: 1, User: user, Kernel: kernel})
		}
		byAddr(c.Flush(time.Unix(3, 0)))
	}
	if st := c.Stats(); st.ChunkEvictions == 0 || st.Locations > capacity*size || st.Locations == 0 {
		t.Errorf("after churn: %d evictions, %d locations held; want evictions and at most %d locations",
			st.ChunkEvictions, st.Locations, capacity*size)
	}
}

// MaxLocations bounds what the cached chunks hold when every stack brings frames of its
// own (code compiled without end): after each flush the locations held are within the
// bound, counts stay exact, and a stack seen again after its chunks went is counted anew.
func TestMaxLocationsBound(t *testing.T) {
	const bound = 500
	c, _ := newAggregator(t, ProcessConfig{ProcFS: t.TempDir()}, Config{ChunkSize: 4, ChunkCapacity: 1 << 16, MaxLocations: bound}, time.Unix(0, 0))
	next := uint64(0x500000)
	for interval := range 6 {
		naive := map[string]int64{}
		for i := range 400 {
			// A shared root, then frames no other stack has.
			user := []uint64{next, next + 1, next + 2, next + 3, 0x400100, 0x400000}
			next += 16
			c.Add(RawSample{PID: 7, TID: 1, Comm: "w", User: user})
			naive[stackKey(1, user)]++
			if i%2 == 0 { // half again, sharing its chunks
				c.Add(RawSample{PID: 7, TID: 1, Comm: "w", User: user})
				naive[stackKey(1, user)]++
			}
		}
		got := counts(c.Flush(time.Unix(int64(interval+1), 0)))
		for k, n := range naive {
			if got[k] != n {
				t.Fatalf("interval %d: stack %s counted %d, want %d", interval, k, got[k], n)
			}
		}
		if st := c.Stats(); st.Locations > bound || c.held > bound {
			t.Fatalf("interval %d: %d locations (%d held) after the flush, bound %d", interval, st.Locations, c.held, bound)
		}
	}
	if st := c.Stats(); st.ChunkEvictions == 0 {
		t.Errorf("no chunk let go: %+v", st)
	}
}

// With MaxIdle, the chunks of a stack no flush listed for that long go with the
// locations only they held, while a stack listed all along keeps its chunks (its
// locations are not resolved again), and a stack that comes back is counted anew.
func TestChunksIdle(t *testing.T) {
	c, _ := newAggregator(t, ProcessConfig{ProcFS: t.TempDir()}, Config{ChunkSize: 4, MaxIdle: 30 * time.Second}, time.Unix(0, 0))
	steady := []uint64{0x400300, 0x400200, 0x400100, 0x400000}
	once := []uint64{0x500300, 0x500200, 0x500100, 0x500000}
	c.Add(RawSample{PID: 7, TID: 1, Comm: "w", User: steady})
	c.Add(RawSample{PID: 7, TID: 1, Comm: "w", User: once})
	first := map[*Location]bool{}
	for _, l := range c.Flush(time.Unix(10, 0)).Locations {
		first[l] = true
	}
	if st := c.Stats(); st.Chunks != 2 || st.Locations != 8 {
		t.Fatalf("after the first flush: %d chunks, %d locations; want 2, 8", st.Chunks, st.Locations)
	}
	for sec := int64(20); sec <= 60; sec += 10 {
		c.Add(RawSample{PID: 7, TID: 1, Comm: "w", User: steady})
		p := c.Flush(time.Unix(sec, 0))
		for _, l := range p.Locations {
			if !first[l] {
				t.Fatalf("flush at %d s resolved %#x again; the steady stack's locations stay", sec, l.Address)
			}
		}
		want := 2
		if sec > 40 { // listed last at 10 s: idle past 40 s
			want = 1
		}
		if st := c.Stats(); st.Chunks != want || st.Locations != 4*want {
			t.Fatalf("after the flush at %d s: %d chunks, %d locations; want %d, %d", sec, st.Chunks, st.Locations, want, 4*want)
		}
	}
	c.Add(RawSample{PID: 7, TID: 1, Comm: "w", User: once})
	p := c.Flush(time.Unix(70, 0))
	if got := counts(p)[stackKey(1, once)]; got != 1 || len(p.Locations) != 4 {
		t.Fatalf("the stack back: counted %d, %d locations listed; want 1, 4", got, len(p.Locations))
	}
}

// The chunk cache against a list kept the obvious way: the same chunks held, in the same
// order of use, and every chunk that leaves, by eviction or removal, told exactly once.
func TestChunkLRUMatchesModel(t *testing.T) {
	for _, capacity := range []int{1, 2, 7, 100} {
		r := rand.New(rand.NewPCG(uint64(capacity), 9))
		var l chunkLRU
		l.init(capacity)
		told := map[*chunk]int{}
		l.onEvict = func(ch *chunk) { told[ch]++ }
		var model []*chunk // oldest first
		find := func(h uint64) int {
			return slices.IndexFunc(model, func(ch *chunk) bool { return ch.hash == h })
		}
		var gone []*chunk
		for step := range 20000 {
			h := uint64(r.IntN(3 * capacity))
			switch op := r.IntN(10); {
			case op < 5: // get, or add on a miss as intern does
				ch, ok := l.get(h)
				if i := find(h); i >= 0 {
					if !ok || ch != model[i] {
						t.Fatalf("capacity %d step %d: get %d = %p %v, want %p", capacity, step, h, ch, ok, model[i])
					}
					model = append(slices.Delete(model, i, i+1), ch)
					continue
				}
				if ok {
					t.Fatalf("capacity %d step %d: get %d found a chunk the model lacks", capacity, step, h)
				}
				ch = &chunk{hash: h}
				evicted := l.add(ch)
				if want := len(model) == capacity; evicted != want {
					t.Fatalf("capacity %d step %d: add evicted %v, want %v", capacity, step, evicted, want)
				}
				if evicted {
					gone = append(gone, model[0])
					model = model[1:]
				}
				model = append(model, ch)
			case op < 7: // remove a cached chunk
				if i := find(h); i >= 0 {
					l.remove(model[i])
					gone = append(gone, model[i])
					model = slices.Delete(model, i, i+1)
				}
			case op < 8: // drop the oldest, as the location bound does
				if len(model) > 0 {
					l.remove(l.oldest())
					gone = append(gone, model[0])
					model = model[1:]
				}
			default:
				l.shrink()
			}
			var order []*chunk
			for ch := l.oldest(); ch != nil; ch = l.next(ch) {
				order = append(order, ch)
			}
			if !slices.Equal(order, model) || l.len() != len(model) {
				t.Fatalf("capacity %d step %d: cache holds %d chunks in another order than the model's %d", capacity, step, l.len(), len(model))
			}
		}
		for _, ch := range gone {
			if told[ch] != 1 || ch.cached {
				t.Fatalf("capacity %d: a chunk that left was told %d times, cached %v", capacity, told[ch], ch.cached)
			}
		}
		for _, ch := range model {
			if told[ch] != 0 || !ch.cached {
				t.Fatalf("capacity %d: a cached chunk was told %d times, cached %v", capacity, told[ch], ch.cached)
			}
		}
	}
}

// The cache costs what it holds, not its capacity: a few thousand distinct stacks under the
// largest capacity take about what they take under a capacity that fits them, and a table
// whose chunks went is made small again.
func TestChunkCacheCostsWhatItHolds(t *testing.T) {
	const distinct = 2000
	stacks := benchStacks(distinct, 15)
	cost := func(capacity int) (float64, *Aggregator) {
		before := heapInUse()
		c := newTestAggregator(t, DefaultChunkSize, capacity)
		for _, s := range stacks {
			c.Add(RawSample{PID: 1, TID: 1, User: s})
		}
		return float64(heapInUse()-before) / distinct, c
	}
	fits, c1 := cost(8192)
	largest, c2 := cost(1 << 20)
	runtime.KeepAlive(c1)
	if largest > fits*1.25 {
		t.Errorf("a distinct stack costs %.0f B under a capacity of 2^20 chunks, %.0f B under 8192", largest, fits)
	}

	base := heapInUse()
	var l chunkLRU
	l.init(1 << 20)
	kept := make([]*chunk, 100000) // the chunks stay: the table alone is measured
	for h := range kept {
		kept[h] = &chunk{hash: uint64(h)}
		l.add(kept[h])
	}
	grown := heapInUse() - base
	for l.len() > 100 {
		l.remove(l.oldest())
	}
	l.shrink()
	// The chunks and kept are not the table.
	table := func(b uint64) float64 { return float64(b) - float64(len(kept))*float64(unsafe.Sizeof(chunk{})+8) }
	shrunk := heapInUse() - base
	t.Logf("table %.0f B at 100 000 chunks, %.0f B at 100", table(grown), table(shrunk))
	if table(shrunk) > table(grown)/20 {
		t.Errorf("the table of 100 chunks left of 100 000 holds %.0f B; at 100 000 it held %.0f B", table(shrunk), table(grown))
	}
	runtime.KeepAlive(kept)
	runtime.KeepAlive(c2)
}
