package unwind

import (
	"debug/elf"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// A streamed table hands the kernel the rows the whole table has, in parts no larger
// than partRows. With a sound .eh_frame_hdr, counting them allocates one part's buffer
// whatever the table's size: the FDEs are read from the sorted table, not listed. Without
// one (.debug_frame, compressed or not), they are listed and sorted.
func TestStreamedTable(t *testing.T) {
	cases := []struct {
		path    string
		variant string // a program built from testdata, when path is ""
	}{{path: libcPath}, {path: libstdcxxPath}, {path: "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0"},
		{variant: "debugframe"}, {variant: "debugframe-z"}}
	for _, c := range cases {
		t.Run(c.path+c.variant, func(t *testing.T) {
			path := c.path
			if path == "" {
				path = requireTestBinary(t, c.variant)
			}
			requireFile(t, path)
			_, f, region := mapHost(t, path)
			whole, err := FromELF(f)
			if err != nil {
				t.Fatal(err)
			}
			want, err := whole.KernelRows()
			if err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			s, err := streamELF(f, nil, region.Release)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			table := s.kernel()
			if table.Rows != len(want) || table.First != want[0].Pc || table.Last != want[len(want)-1].Pc {
				t.Fatalf("counted %d rows from %#x to %#x; the whole table has %d from %#x to %#x",
					table.Rows, table.First, table.Last, len(want), want[0].Pc, want[len(want)-1].Pc)
			}
			for range 2 { // as often as the kernel asks
				var got []KernelRow
				parts := 0
				if err := table.Each(func(part []KernelRow) error {
					if len(part) == 0 || len(part) > partRows {
						t.Errorf("a part of %d rows", len(part))
					}
					parts++
					got = append(got, part...)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%d rows streamed in %d parts differ from the %d of the whole table", len(got), parts, len(want))
				}
			}
			// The whole table's rows were 24 bytes each; a part's buffer is partRows of them.
			rowBytes := uint64(len(want)) * uint64(unsafe.Sizeof(Row{}))
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d rows, %d bytes whole: counting them allocated %d bytes", len(want), rowBytes, alloc)
			if c.path != "" && alloc > partRows*uint64(unsafe.Sizeof(Row{}))+16<<10 {
				t.Errorf("counting %d rows (%d bytes whole) allocated %d bytes", len(want), rowBytes, alloc)
			}
		})
	}
}

// A part's writing that fails stops the table, and the failure is Each's.
func TestStreamedTableWriteFails(t *testing.T) {
	requireFile(t, libcPath)
	_, f, _ := mapHost(t, libcPath)
	s, err := streamELF(f, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	full := errors.New("no room")
	parts := 0
	err = s.kernel().Each(func([]KernelRow) error {
		parts++
		return full
	})
	if err != full || parts != 1 {
		t.Errorf("Each returned %v after %d parts; want the first part's failure", err, parts)
	}
	// A table that reads back otherwise than it was counted is refused.
	s.rows++
	if err := s.kernel().Each(func([]KernelRow) error { return nil }); err == nil {
		t.Error("a table read again with a row fewer than counted was taken")
	}
}

// The builder's rows handed out through a small buffer are the rows it builds whole,
// whatever the buffer's size: the rows kept back at each part's end (the last, which a
// row at its address may replace, and the one before it, which the next may merge with)
// are handed out once.
func TestRowSinkParts(t *testing.T) {
	requireFile(t, libcPath)
	_, f, _ := mapHost(t, libcPath)
	src, err := frameSourceOf(f)
	if err != nil {
		t.Fatal(err)
	}
	fdes := sortedFDEs(src.sec, src.hdr)
	whole := builder{sec: src.sec, rowSink: &rowSink{}}
	whole.run(fdeList(fdes))
	for _, size := range []int{2, 3, 5, 64, 4095} {
		var got []Row
		b := builder{sec: src.sec, rowSink: &rowSink{rows: make([]Row, 0, size), out: func(part []Row) {
			if len(part) > size {
				t.Errorf("a part of %d rows from a buffer of %d", len(part), size)
			}
			got = append(got, part...)
		}}}
		b.run(fdeList(fdes))
		if !slices.Equal(got, whole.rows) {
			t.Errorf("through a buffer of %d: %d rows, built whole %d", size, len(got), len(whole.rows))
		}
	}
}

// The same through small buffers for any run of rows: rules that repeat, and rows at
// the address of the row before, which replace it and may merge with the one before that.
func TestRowSinkRandom(t *testing.T) {
	rnd := rand.New(rand.NewPCG(45, 7))
	rules := []Row{{}, {CFA: CFASP, CFAOffset: 8}, {CFA: CFASP, CFAOffset: 16}, {CFA: CFAPLT}}
	for i := range 5000 {
		type emit struct {
			pc uint64
			r  Row
		}
		var emits []emit
		pc := uint64(0)
		for range rnd.IntN(60) {
			if rnd.IntN(3) > 0 {
				pc += 1 + uint64(rnd.IntN(3))
			}
			emits = append(emits, emit{pc, rules[rnd.IntN(len(rules))]})
		}
		whole := &rowSink{}
		size := 2 + rnd.IntN(5)
		var got []Row
		parts := &rowSink{rows: make([]Row, 0, size), out: func(part []Row) { got = append(got, part...) }}
		for _, e := range emits {
			whole.emit(e.pc, e.r)
			parts.emit(e.pc, e.r)
		}
		parts.finish()
		if !slices.Equal(got, whole.rows) {
			t.Fatalf("case %d, a buffer of %d: %v\nin parts %v\nwhole    %v", i, size, emits, got, whole.rows)
		}
	}
}

// withFramePointerCode lays ranges over a whole table one after another: what the
// streamed table's overlay must give.
func withFramePointerCode(rows []Row, ranges [][2]uint64) []Row {
	for _, r := range ranges {
		rows = replaceRange(rows, []Row{{PC: r[0], CFA: CFAFramePointer}}, r[0], r[1])
	}
	return rows
}

// The overlay of frame-pointer code on a streamed table is replaceRange's on the whole
// table, for ranges before, inside, across and after its rows, overlapping, adjacent or
// touching rows' addresses, through buffers of any size.
func TestFPOverlay(t *testing.T) {
	rnd := rand.New(rand.NewPCG(7, 45))
	rules := []Row{{}, {CFA: CFASP, CFAOffset: 8}, {CFA: CFASP, CFAOffset: 16}, {CFA: CFAFP, CFAOffset: 16, FP: FPAtCFA, FPOffset: -16}, {CFA: CFAPLT}}
	for i := range 3000 {
		var rows []Row
		pc := uint64(rnd.IntN(4))
		for range rnd.IntN(40) {
			r := rules[rnd.IntN(len(rules))]
			r.PC = pc
			if n := len(rows); n == 0 || !sameRule(rows[n-1], r) {
				rows = append(rows, r)
			}
			pc += 1 + uint64(rnd.IntN(6))
		}
		var ranges [][2]uint64
		for range rnd.IntN(5) {
			start := uint64(rnd.IntN(int(pc) + 8))
			ranges = append(ranges, [2]uint64{start, start + uint64(rnd.IntN(12))})
		}
		want := withFramePointerCode(slices.Clone(rows), ranges)
		joined := fpRanges(nil, []FramePointerCodeFunc{func(*elf.File) [][2]uint64 { return slices.Clone(ranges) }})
		size := 2 + rnd.IntN(6)
		var got []Row
		final := &rowSink{rows: make([]Row, 0, size), out: func(part []Row) { got = append(got, part...) }}
		over := &fpOverlay{ranges: joined, next: final}
		in := &rowSink{rows: make([]Row, 0, 2+rnd.IntN(6)), out: over.add}
		for _, r := range rows {
			in.emit(r.PC, r)
		}
		in.finish()
		over.finish()
		if !slices.Equal(got, want) {
			t.Fatalf("case %d: rows %v, ranges %v:\noverlay  %v\nreplaced %v", i, rows, ranges, got, want)
		}
	}
}

// readTable hands back a table that can be taken until release, whatever the file.
func TestReadTableRelease(t *testing.T) {
	requireFile(t, libcPath)
	table, _, _, _, release, err := readTable(objfile.HostFile(objfile.Key{}, libcPath), nil)
	if err != nil {
		t.Fatal(err)
	}
	if table.Rows < 1000 {
		t.Fatalf("%d rows for libc", table.Rows)
	}
	runtime.GC() // the file's mapping must outlive a collection while release is held
	rows, err := tableRows(table)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range rows {
		if r.CfaRule != uint8(CFAInvalid) {
			n++
		}
	}
	if n == 0 {
		t.Error("no row with a rule")
	}
	release()
	_, _, _, _, release, err = readTable(objfile.HostFile(objfile.Key{}, "/nonexistent/lib.so"), nil)
	if err == nil {
		t.Error("a missing file was read")
	}
	release() // callable on every path
}
