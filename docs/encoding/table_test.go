package encoding

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"
)

var table = flag.Bool("table", false, "TestTable: print docs/encoding.md's tables (takes a few minutes)")

// TestTable prints the tables of docs/encoding.md in markdown:
//
//	go test -run '^TestTable$' -v ./docs/encoding -args -table
//
// Time and allocations come from testing.Benchmark, so they vary with the machine
// and its load; sizes do not.
func TestTable(t *testing.T) {
	if !*table {
		t.Skip("prints the study's tables; run with -args -table")
	}
	w := io.Writer(os.Stdout)
	cs := loadCorpora(t)
	fmt.Fprintf(w, "\n%s, %s/%s, %d CPUs\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())

	fmt.Fprintf(w, "\n#### Corpora\n\n")
	fmt.Fprintln(w, "|corpus|records|samples|distinct stacks|locations|functions|mean depth|median depth|max depth|mean depth of distinct stacks|")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, c := range cs {
		s := c.Stats()
		fmt.Fprintf(w, "|%s|%s|%s|%s|%s|%s|%.1f|%d|%d|%.1f|\n", c.Name, num(s.Records), num(int(s.Samples)),
			num(s.DistinctStacks), num(s.Locations), num(s.Functions), s.MeanDepth, s.MedianDepth, s.MaxDepth, s.MeanStackDepth)
	}

	for _, c := range cs {
		fmt.Fprintf(w, "\n#### %q\n\n", c.Name)
		fmt.Fprintln(w, "|encoding|bytes|gzip bytes|zstd bytes|stack bytes|table ints|encode ns|encode allocs|encode B/op|agent peak bytes|decode ns|decode allocs|of which stacks|decoded live bytes|")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
		for _, codec := range Codecs() {
			m, err := measureEncode(c, codec)
			if err != nil {
				t.Fatal(err)
			}
			ints, err := tableInts(c, codec)
			if err != nil {
				t.Fatal(err)
			}
			stackAllocs, err := stackDecodeAllocs(c, codec)
			if err != nil {
				t.Fatal(err)
			}
			enc := bestOf(func(b *testing.B) { benchEncode(b, c, codec) })
			dec := bestOf(func(b *testing.B) { benchDecode(b, c, codec) })
			fmt.Fprintf(w, "|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", codec.Name, num(m.Bytes), num(m.Gzip), num(m.Zstd), num(m.Stack), num(ints),
				num(int(enc.NsPerOp())), num(int(enc.AllocsPerOp())), num(int(enc.AllocedBytesPerOp())), num(int(m.Peak)),
				num(int(dec.NsPerOp())), num(int(dec.AllocsPerOp())), num(stackAllocs), num(int(dec.Extra["live-B"])))
		}
	}

	fmt.Fprintf(w, "\n#### Chunked: chunk size and LRU size\n\n")
	fmt.Fprintln(w, "|corpus|chunk|LRU entries|bytes|gzip bytes|zstd bytes|stack bytes|chunks reused|refs per sample|encode ns|agent peak bytes|")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, c := range cs {
		for _, p := range sweep() {
			codec := ChunkedCodec(p.k, p.lru)
			m, err := measureEncode(c, codec)
			if err != nil {
				t.Fatal(err)
			}
			enc := codec.New().(*chunkedEncoder)
			if _, err := enc.Encode(c); err != nil {
				t.Fatal(err)
			}
			bench := bestOf(func(b *testing.B) { benchEncode(b, c, codec) })
			fmt.Fprintf(w, "|%s|%d|%s|%s|%s|%s|%s|%.0f %%|%.2f|%s|%s|\n", c.Name, p.k, num(p.lru), num(m.Bytes), num(m.Gzip), num(m.Zstd), num(m.Stack),
				100*float64(enc.hits)/float64(enc.hits+enc.misses), float64(enc.nrefs)/float64(len(c.Samples)),
				num(int(bench.NsPerOp())), num(int(m.Peak)))
		}
	}

	fmt.Fprintf(w, "\n#### Kernel side: ring-buffer bytes per sample with chunk hashes in a BPF LRU\n\n")
	fmt.Fprintf(w, "Record today: %d-byte header + %d bytes a frame. Proposed: header + %d-byte hash a chunk + the frames of chunks the LRU lacks.\n\n",
		DefaultKernelModel.Header, DefaultKernelModel.Frame, DefaultKernelModel.Hash)
	fmt.Fprintln(w, "|corpus|chunk|LRU entries|samples|bytes/sample today|bytes/sample proposed|saving|samples ≥50 deep|saving at ≥50|chunks found|")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, c := range cs {
		for _, k := range []int{4, 8, 16} {
			for _, n := range []int{1024, 4096} {
				r, err := SimulateKernel(c, DefaultKernelModel, k, n, 50)
				if err != nil {
					t.Fatal(err)
				}
				if r.Collisions != 0 {
					t.Errorf("%s: %d chunk hash collisions", c.Name, r.Collisions)
				}
				deep := "–"
				if r.DeepEvents > 0 {
					deep = fmt.Sprintf("%.1f %%", 100*r.DeepSaving())
				}
				fmt.Fprintf(w, "|%s|%d|%s|%s|%.0f|%.0f|%.1f %%|%s|%s|%.0f %%|\n", c.Name, k, num(n), num(int(r.Events)),
					float64(r.Today)/float64(r.Events), float64(r.Proposed)/float64(r.Events), 100*r.Saving(),
					num(int(r.DeepEvents)), deep, 100*float64(r.ChunkHits)/float64(r.ChunkHits+r.ChunkMisses))
			}
		}
	}

	fmt.Fprintf(w, "\n#### Kernel side with sonde's own record\n\n")
	fmt.Fprintf(w, "sonde's sample_event has a %d-byte header and room for %d frames, %s bytes whatever the depth.\n\n", sondeHeader, sondeFrames, num(sondeRecord))
	fmt.Fprintln(w, "|corpus|bytes/sample, fixed record|variable-length record|variable, chunk hashes (8, 4,096)|saving of hashes over variable|")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, c := range cs {
		m := KernelModel{Header: sondeHeader, Frame: 8, Hash: 8}
		r, err := SimulateKernel(c, m, 8, 4096, 50)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(w, "|%s|%s|%.0f|%.0f|%.1f %%|\n", c.Name, num(sondeRecord), float64(r.Today)/float64(r.Events),
			float64(r.Proposed)/float64(r.Events), 100*r.Saving())
	}
}

// sonde's struct sample_event (bpf/types.h): kind, pid, tid, cpu, ktime_ns, comm[16],
// user_len, kernel_len, unwind_end, pad, then MAX_USER_DEPTH + MAX_STACK_DEPTH frames.
const (
	sondeHeader = 56
	sondeFrames = 128 + 127
	sondeRecord = sondeHeader + 8*sondeFrames
)

// sweep is the grid of chunk and LRU sizes the chunked encoding is tried with.
func sweep() []struct{ k, lru int } {
	var out []struct{ k, lru int }
	for _, k := range []int{4, 8, 16} {
		for _, lru := range []int{256, 1024, 4096} {
			out = append(out, struct{ k, lru int }{k, lru})
		}
	}
	return out
}

// bestOf runs a benchmark three times and keeps the fastest run: on a shared machine
// the other runs measure the neighbours. Allocations do not vary between runs.
func bestOf(f func(*testing.B)) testing.BenchmarkResult {
	best := testing.Benchmark(f)
	for range 2 {
		if r := testing.Benchmark(f); r.NsPerOp() < best.NsPerOp() {
			best = r
		}
	}
	return best
}

// tableInts counts the integers an encoding spends on its shared stack tables:
// location_indices, both calltree arrays, or every stack_table entry; pprof has none.
func tableInts(c *Corpus, codec Codec) (int, error) {
	enc := codec.New()
	if _, err := enc.Encode(c); err != nil {
		return 0, err
	}
	switch e := enc.(type) {
	case *slicesEncoder:
		return len(e.li), nil
	case *chunkedEncoder:
		return len(e.li), nil
	case *calltreeEncoder:
		return 2 * len(e.parents), nil
	case *stackTableEncoder:
		n := 0
		for _, s := range e.req.Dictionary.StackTable {
			n += len(s.LocationIndices)
		}
		return n, nil
	case *stackTableWireEncoder:
		n := 0
		for k := range e.stacks {
			n += len(k) / 4
		}
		return n, nil
	}
	return 0, nil
}

// stackDecodeAllocs is what decoding allocates for the stacks alone: the allocations
// of a decode less those of decoding the same encoding with every stack emptied.
func stackDecodeAllocs(c *Corpus, codec Codec) (int, error) {
	allocs := func(c *Corpus) (float64, error) {
		msg, err := codec.New().Encode(c)
		if err != nil {
			return 0, err
		}
		msg = append([]byte(nil), msg...)
		var derr error
		n := testing.AllocsPerRun(20, func() {
			if _, err := codec.Decode(msg); err != nil {
				derr = err
			}
		})
		return n, derr
	}
	full, err := allocs(c)
	if err != nil {
		return 0, err
	}
	empty, err := allocs(c.withoutStacks())
	if err != nil {
		return 0, err
	}
	return int(full - empty), nil
}

// num writes n with thousands separators, as OTEP 239's tables do.
func num(n int) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
