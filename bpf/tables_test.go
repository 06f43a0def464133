package bpf

import (
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"unsafe"
)

// findRowModel is the kernel's find_row (unwinder.h) in Go, over a table as the kernel
// holds it: count rows, then their index. It returns the row's position, or -1.
func findRowModel(table []UnwindRow, count int, vaddr uint32) int {
	lo, hi := 0, count
	if count < len(table) {
		hdr := indexWords(table[count])
		if pages := hdr[1]; pages > 0 {
			page := vaddr >> (hdr[2] & 31)
			if page < hdr[0] {
				return -1
			}
			page = min(page-hdr[0], pages)
			entry := func(k uint32) int { return int(indexWords(table[count+1+int(k>>2)])[k&3]) }
			l, h := entry(page), count
			if page < pages {
				h = entry(page+1) + 1
			}
			if h > l && h <= count {
				lo, hi = l, h
			}
		}
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if table[mid].Pc <= vaddr {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo - 1
}

func indexWords(r UnwindRow) [4]uint32 { return *(*[4]uint32)(unsafe.Pointer(&r)) }

// The index narrows every search to the row a search of the whole table finds, at and
// between rows, below the first and past the last, over dense code and wide gaps, and
// costs at most a thirty-second of the rows.
func TestRowIndex(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		n := minIndexedRows + r.IntN(5000)
		if trial%10 == 0 {
			n = r.IntN(minIndexedRows) + 1 // too small: no index
		}
		rows := make([]UnwindRow, n)
		pc := r.Uint32N(1 << 24)
		for i := range rows {
			rows[i].Pc = pc
			switch r.IntN(20) {
			case 0:
				pc += r.Uint32N(1 << 20) // a gap: another section, or code without rows
			default:
				pc += 1 + r.Uint32N(200)
			}
		}
		index := rowIndex(rows)
		// Built as a streamed table's parts go by, the index is the same.
		x := newRowIndexer(n, rows[0].Pc, rows[n-1].Pc)
		for at := 0; at < n; {
			part := min(n-at, 1+r.IntN(600))
			x.add(at, rows[at:at+part])
			at += part
		}
		if parts := x.finish(); !slices.Equal(parts, index) {
			t.Fatalf("%d rows: the index built by parts differs", n)
		}
		if n < minIndexedRows != (index == nil) {
			t.Fatalf("%d rows: index of %d slots", n, len(index))
		}
		if len(index) > n/32+2 {
			t.Fatalf("%d rows: index of %d slots, more than a thirty-second", n, len(index))
		}
		table := append(rows[:n:n], index...)
		probe := func(vaddr uint32) {
			want := sort.Search(n, func(i int) bool { return rows[i].Pc > vaddr }) - 1
			if got := findRowModel(table, n, vaddr); got != want {
				t.Fatalf("trial %d, %d rows: row of %#x is %d, want %d", trial, n, vaddr, got, want)
			}
		}
		probe(0)
		probe(rows[0].Pc - 1)
		probe(^uint32(0))
		for _, row := range rows {
			probe(row.Pc)
			probe(row.Pc - 1)
			probe(row.Pc + 1)
		}
		for range 2000 {
			probe(rows[0].Pc - 64 + r.Uint32N(rows[n-1].Pc-rows[0].Pc+128))
		}
	}
}

// rowIndex returns the index by page of code that follows rows in the kernel's table, as
// find_row reads it, for rows sorted by pc as tables are; nil for a small table.
func rowIndex(rows []UnwindRow) []UnwindRow {
	if len(rows) == 0 {
		return nil
	}
	x := newRowIndexer(len(rows), rows[0].Pc, rows[len(rows)-1].Pc)
	x.add(0, rows)
	return x.finish()
}

// RowsOf is a table whose rows are all in memory, handed over in one part.
func RowsOf(rows []UnwindRow) TableRows {
	if len(rows) == 0 {
		return TableRows{Each: func(func([]UnwindRow) error) error { return nil }}
	}
	return TableRows{Len: len(rows), First: rows[0].Pc, Last: rows[len(rows)-1].Pc,
		Each: func(part func([]UnwindRow) error) error { return part(rows) }}
}
