package dwarf

import (
	"errors"
	"fmt"
)

// ErrDecompressBudget is the error of a table whose compressed sections would not fit
// the cache's bound on decompressed copies even alone: its lookups are left to the
// symbol table rather than let one file's DWARF take the memory of every other.
var ErrDecompressBudget = errors.New("decompressed dwarf over its budget")

// The decompressed copies of compressed sections (a Go binary's, most distributions'
// debug files) are the largest transient memory naming takes: a few megabytes to tens
// of megabytes a file, all of a file's at once, outside the Go heap where the runtime's
// limit does not see them. A Cache bounds them across its tables, as it bounds decoded
// units: a table about to decompress makes room by dropping the copies of the tables
// that used theirs longest ago.

// LimitDecompressed bounds the decompressed copies the cache's tables hold together, in
// bytes; 0 (the default) means no bound. A table whose compressed sections exceed the
// bound alone fails to load with ErrDecompressBudget.
func (c *Cache) LimitDecompressed(maxBytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scratchMax = max(maxBytes, 0)
}

// DecompressedStats are the cache's decompressed copies: held now, the most held at
// once, and the tables refused for needing more than the bound alone.
type DecompressedStats struct {
	Bytes, PeakBytes int64
	TotalBytes       int64 // every decompression added up
	Refused          int
}

// Decompressed reports the decompressed copies held; a nil cache holds none.
func (c *Cache) Decompressed() DecompressedStats {
	if c == nil {
		return DecompressedStats{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return DecompressedStats{Bytes: c.scratch, PeakBytes: c.scratchPeak, TotalBytes: c.scratchTotal, Refused: c.scratchRefused}
}

// admit checks at load time that a table's compressed sections fit the bound at all.
func (c *Cache) admit(size int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.scratchMax > 0 && size > c.scratchMax {
		c.scratchRefused++
		return fmt.Errorf("%w: %d bytes, %d allowed", ErrDecompressBudget, size, c.scratchMax)
	}
	return nil
}

// reserve accounts n bytes t is about to decompress, first dropping other tables'
// copies, least recently used first, while the total would exceed the bound. The
// caller holds t.mu; other tables are only tried (a table busy decoding keeps its
// copies, and the bound is then exceeded for the moment rather than waited on).
func (c *Cache) reserve(t *Table, n int64) { c.reserveInflated(t, n, n) }

// reserveInflated is reserve for n bytes held of inflated bytes decompressed: a
// section decompressed a block at a time keeps the blocks decoding needs only.
func (c *Cache) reserveInflated(t *Table, n, inflated int64) {
	busy := map[*Table]bool{}
	for {
		c.mu.Lock()
		if c.scratchMax == 0 || c.scratch+n <= c.scratchMax {
			break // with c.mu held
		}
		var victim *Table
		for h := range c.holders {
			if h != t && !busy[h] && (victim == nil || h.scratchUsed < victim.scratchUsed) {
				victim = h
			}
		}
		c.mu.Unlock()
		if victim == nil {
			c.mu.Lock()
			break
		}
		if !victim.mu.TryLock() {
			busy[victim] = true
			continue
		}
		victim.dropScratch()
		victim.mu.Unlock()
	}
	defer c.mu.Unlock()
	c.scratch += n
	c.scratchTotal += inflated
	c.scratchPeak = max(c.scratchPeak, c.scratch)
	if c.holders == nil {
		c.holders = map[*Table]bool{}
	}
	c.holders[t] = true
	c.touchLocked(t)
}

// release accounts n bytes of t's copies dropped; empty says t holds none after.
func (c *Cache) release(t *Table, n int64, empty bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scratch -= n
	if empty {
		delete(c.holders, t)
	}
}

// unreserve takes back n bytes reserved and not decompressed after all.
func (c *Cache) unreserve(n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scratch -= n
	c.scratchTotal -= n
}

// touch marks t's copies as just used.
func (c *Cache) touch(t *Table) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.touchLocked(t)
}

func (c *Cache) touchLocked(t *Table) {
	c.clock++
	t.scratchUsed = c.clock
}

// dropScratch lets go of t's decompressed copies. The caller holds t.mu or owns t.
func (t *Table) dropScratch() { t.dropScratchKeeping(false) }

// maxKeptMarks bounds the marks and packed chunks a table keeps when its copies go for
// being idle: the C library's debug file has 101 marks (581 KB), and once its passes
// have kept meeting new units, .debug_abbrev packed (255 KB) in place of its four
// (13 KB). Without them the first new unit after each idle time walked its
// .debug_info from the start, 5.6 MB and 38 ms of CPU. A file with more (a browser's
// tens of megabytes) walks from the start again rather than hold megabytes for it.
const maxKeptMarks = 3 << 19

// dropScratchKeeping is dropScratch, keeping the lazy sections' marks when keepMarks
// and they are few (maxKeptMarks). The marks stay accounted, and go when the bound
// needs their room.
func (t *Table) dropScratchKeeping(keepMarks bool) {
	keepMarks = keepMarks && t.markBytes() <= maxKeptMarks
	var freed, kept int64
	for i := range t.secs {
		sec := &t.secs[i]
		if sec.scratch != nil {
			freed += int64(sec.size)
			sec.drop()
		}
		if l := sec.lazy; l != nil {
			if keepMarks {
				freed += l.dropKeepingMarks()
				kept += l.held
			} else {
				freed += l.drop()
			}
		}
	}
	t.hold = false
	if freed > 0 || kept == 0 {
		t.cache.release(t, freed, kept == 0)
	}
}
