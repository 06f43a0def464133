package unwind

import (
	"cmp"
	"debug/elf"
	"fmt"
	"iter"
	"math"
	"slices"

	"github.com/sonde-profiler/sonde/internal/mmapfile"
)

// KernelTable is a file's table on its way to the kernel. Its size and the addresses of
// its first and last rows are known before its rows, which Each hands over in pc order,
// in parts valid only for the call that takes them. Each may be called again (a retry
// once a table is evicted) and returns the first error a part's writing returned.
type KernelTable struct {
	Rows        int
	First, Last uint32
	Each        func(part func([]KernelRow) error) error
}

// KernelTableOf is a table whose rows are all in memory already, handed over in one part.
func KernelTableOf(rows []KernelRow) KernelTable {
	if len(rows) == 0 {
		return KernelTable{Each: func(func([]KernelRow) error) error { return nil }}
	}
	return KernelTable{
		Rows:  len(rows),
		First: rows[0].Pc,
		Last:  rows[len(rows)-1].Pc,
		Each:  func(part func([]KernelRow) error) error { return part(rows) },
	}
}

// partRows is the most rows a streamed table holds while it is built: 96 KB of rows,
// then 64 KB as the kernel takes them.
const partRows = 4096

// streamedTable is a call frame section's table that is never whole in memory: it is
// built once to count its rows, and again each time the kernel takes them, a part at a
// time. Building libpython's table whole held 64 000 rows, 1.5 MB, for the moment a new
// CPython's files were read, and Node's 550 000 rows 13 MB; building it twice costs the
// CFA programs' interpretation once more per file, a file being read once.
type streamedTable struct {
	sec *frameSection
	// fdes hands out the FDEs by start address: read one at a time from
	// .eh_frame_hdr's sorted table where it is sound (Node's executable has 76 000, 2.4
	// MB as a list), else from a list.
	fdes iter.Seq[*fde]
	// release gives back the pages of the sections read in place, every
	// releaseEveryFDEs FDEs of a pass; nil when nothing is mapped.
	release func([]byte)
	hdr     []byte
	// fpCode are the ranges of frame-pointer code laid over the table (FramePointerCode),
	// sorted and disjoint.
	fpCode      [][2]uint64
	rows        int
	first, last uint64
	// buf holds the part being built, overBuf the rows on their way to the overlay:
	// allocated once for every pass, and small for a small file's table (most of a new
	// program's libraries, each read once).
	buf, overBuf []Row
}

// releaseEveryFDEs is how many FDEs a pass reads between two releases of the pages it
// read. The FDEs go by address, and the linker need not have laid out .eh_frame in that
// order (Node's is not), while the kernel maps 64 KB around each page read: every 4 096
// FDEs, building Node's table still peaked 2.8 MB above RSS; every 256, 1.7 MB, for a
// tenth more CPU; every 64, 1.3 MB for a third more.
const releaseEveryFDEs = 256

// streamELF reads the call frame section of f and counts its table's rows, with the
// frame-pointer code the finders find in f laid over them. release, when not nil, gives
// back pages of the mapped file under a slice of it.
func streamELF(f *elf.File, finders []FramePointerCodeFunc, release func([]byte)) (*streamedTable, error) {
	src, err := frameSourceOf(f)
	if err != nil {
		return nil, err
	}
	t := &streamedTable{sec: src.sec, fpCode: fpRanges(f, finders), release: release}
	var fdes int
	if cies := map[int]*cie{}; src.hdr != nil && t.inOrder(src.hdr, cies) {
		h := src.hdr
		t.fdes = func(yield func(*fde) bool) {
			var cur fde // one for the pass: the builder does not keep it
			h.walk(src.sec, cies, func(f fde) bool {
				cur = f
				return yield(&cur)
			})
		}
		t.hdr, fdes = h.table.b, int(h.count)
	} else {
		list := sortedFDEs(src.sec, src.hdr)
		t.fdes, fdes = fdeList(list), len(list)
	}
	// The estimate may err low: the buffer then fills, and its part is handed on.
	size := min(max(rowEstimate(len(src.sec.data), fdes), 2), partRows)
	t.buf = make([]Row, 0, size)
	if len(t.fpCode) > 0 {
		t.overBuf = make([]Row, 0, size)
	}
	t.pass(func(rows []Row) {
		if t.rows == 0 {
			t.first = rows[0].PC
		}
		t.rows += len(rows)
		t.last = rows[len(rows)-1].PC
	})
	if t.last > math.MaxUint32 {
		return nil, fmt.Errorf("unwind: code above 4 GiB of address space (%#x)", t.last)
	}
	return t, nil
}

// inOrder reports whether h is usable and lists the FDEs in order of their own start
// addresses, as a table is built: then the FDEs can be read from it one at a time, as
// often as the table is built, rather than listed. It reads all of both sections, and
// gives back their pages as it goes.
func (t *streamedTable) inOrder(h *ehHdr, cies map[int]*cie) bool {
	t.hdr = h.table.b
	defer func() { t.hdr = nil }()
	var last uint64
	sorted, n := true, 0
	ok := h.walk(t.sec, cies, func(f fde) bool {
		if n++; n%releaseEveryFDEs == 0 {
			t.giveBack()
		}
		sorted = f.start >= last
		last = f.start
		return sorted
	})
	return ok && sorted
}

// pass builds the table, handing its rows to out in parts of at most partRows.
func (t *streamedTable) pass(out func([]Row)) {
	final := &rowSink{rows: t.buf[:0], out: out}
	b := builder{sec: t.sec, rowSink: final}
	var over *fpOverlay
	if len(t.fpCode) > 0 {
		over = &fpOverlay{ranges: t.fpCode, next: final}
		b.rowSink = &rowSink{rows: t.overBuf[:0], out: over.add}
	}
	b.run(t.paced())
	if over != nil {
		over.finish()
	}
	t.giveBack()
}

// paced is fdes giving back the pages read every releaseEveryFDEs FDEs: they would
// otherwise stay resident until the kernel has the table (Node's .eh_frame is 2.8 MB,
// its sorted table 0.6 MB).
func (t *streamedTable) paced() iter.Seq[*fde] {
	if t.release == nil {
		return t.fdes
	}
	return func(yield func(*fde) bool) {
		n := 0
		for f := range t.fdes {
			if n++; n%releaseEveryFDEs == 0 {
				t.giveBack()
			}
			if !yield(f) {
				return
			}
		}
	}
}

func (t *streamedTable) giveBack() {
	if t.release != nil {
		t.release(t.sec.data)
		t.release(t.hdr)
	}
}

// kernel is the table as the kernel takes it. The section it reads must stay mapped
// until the kernel has it.
func (t *streamedTable) kernel() KernelTable {
	return KernelTable{Rows: t.rows, First: uint32(t.first), Last: uint32(t.last), Each: t.each}
}

func (t *streamedTable) each(write func([]KernelRow) error) error {
	rows := make([]KernelRow, 0, min(t.rows, cap(t.buf)))
	n := 0
	var err error
	fault := mmapfile.Guard(func() {
		t.pass(func(part []Row) {
			if err != nil {
				return
			}
			rows = rows[:0]
			for _, r := range part {
				rows = append(rows, r.kernel())
			}
			n += len(rows)
			err = write(rows)
		})
	})
	switch {
	case fault != nil:
		return fmt.Errorf("unwind: read the table again: %w", fault)
	case err != nil:
		return err
	case n != t.rows:
		// A file changed under its mapping, in place.
		return fmt.Errorf("unwind: a table of %d rows read again as %d", t.rows, n)
	}
	return nil
}

// fpRanges finds the frame-pointer code in f, sorted, with overlapping and adjacent
// ranges joined: laid over a table one after another, as withFramePointerCode does, they
// cover their union.
func fpRanges(f *elf.File, finders []FramePointerCodeFunc) [][2]uint64 {
	var ranges [][2]uint64
	for _, find := range finders {
		for _, r := range find(f) {
			if r[0] < r[1] {
				ranges = append(ranges, r)
			}
		}
	}
	slices.SortFunc(ranges, func(a, b [2]uint64) int { return cmp.Compare(a[0], b[0]) })
	joined := ranges[:0]
	for _, r := range ranges {
		if n := len(joined); n > 0 && r[0] <= joined[n-1][1] {
			joined[n-1][1] = max(joined[n-1][1], r[1])
			continue
		}
		joined = append(joined, r)
	}
	return joined
}

// fpOverlay lays frame-pointer rows over ranges of a table as its rows go by, what
// replaceRange does to a whole table: in [start, end) the frame pointer is the rule, and
// at end the rule in effect there before.
type fpOverlay struct {
	ranges [][2]uint64 // sorted, disjoint, none empty
	i      int         // the range not yet closed
	in     bool        // inside ranges[i]
	before Row         // the last row taken: the rule in effect until the next one
	next   *rowSink
}

func (o *fpOverlay) add(rows []Row) {
	for _, r := range rows {
		o.closeBefore(r.PC)
		o.before = r
		if !o.in {
			o.next.emit(r.PC, r)
		}
	}
}

// closeBefore opens the ranges that start at or before pc and closes those that end
// at or before it. A range ending at pc is closed by the row at pc itself.
func (o *fpOverlay) closeBefore(pc uint64) {
	for o.i < len(o.ranges) {
		start, end := o.ranges[o.i][0], o.ranges[o.i][1]
		if !o.in {
			if start > pc {
				return
			}
			o.next.emit(start, Row{CFA: CFAFramePointer})
			o.in = true
		}
		if end > pc {
			return
		}
		if end < pc {
			o.next.emit(end, o.before)
		}
		o.in = false
		o.i++
	}
}

// finish lays the ranges past the last row and hands out what the next sink holds.
func (o *fpOverlay) finish() {
	for ; o.i < len(o.ranges); o.i++ {
		if !o.in {
			o.next.emit(o.ranges[o.i][0], Row{CFA: CFAFramePointer})
		}
		o.next.emit(o.ranges[o.i][1], o.before)
		o.in = false
	}
	o.next.finish()
}
