package dwarf

import "sync"

// Cache keeps the units lookups decoded, of any number of tables, within a bound
// in bytes: the least recently used go first. The unit decoded last stays however
// large it is, so that a run of lookups in a unit larger than the bound (a large
// program built as one unit, with LTO) decodes it once.
type Cache struct {
	mu       sync.Mutex
	maxBytes int64
	bytes    int64
	n        int
	head     *cached // most recently used; the list is circular

	// Decompressed sections (scratch.go).
	scratchMax     int64
	scratch        int64
	scratchPeak    int64
	scratchTotal   int64
	scratchRefused int
	holders        map[*Table]bool // tables holding decompressed copies
	clock          uint64          // orders the holders' last use
}

type cached struct {
	t          *Table
	unit       uint32
	ut         *unitTable
	size       int64
	prev, next *cached
}

// NewCache returns a cache holding up to maxBytes of decoded units, as estimated;
// with 0 it keeps the one decoded last.
func NewCache(maxBytes int64) *Cache {
	return &Cache{maxBytes: max(maxBytes, 0)}
}

// Bytes is the estimated memory of the units held; a nil cache holds none.
func (c *Cache) Bytes() int64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// Len is the number of units held.
func (c *Cache) Len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// Shed drops every unit and returns the memory they held, as estimated.
func (c *Cache) Shed() int64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	freed := c.bytes
	for c.head != nil {
		c.remove(c.head)
	}
	return freed
}

func (c *Cache) get(t *Table, u uint32) *unitTable {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := t.decoded[u]
	if e == nil {
		return nil
	}
	c.unlink(e)
	c.pushFront(e)
	return e.ut
}

func (c *Cache) add(t *Table, u uint32, ut *unitTable) {
	size := ut.sizeBytes()
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.decoded[u] != nil {
		return
	}
	for c.bytes+size > c.maxBytes && c.head != nil {
		c.remove(c.head.prev)
	}
	e := &cached{t: t, unit: u, ut: ut, size: size}
	if t.decoded == nil {
		t.decoded = map[uint32]*cached{}
	}
	t.decoded[u] = e
	c.bytes += size
	c.n++
	c.pushFront(e)
}

// dropTable drops the units of t.
func (c *Cache) dropTable(t *Table) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range t.decoded {
		c.remove(e)
	}
	t.decoded = nil
}

func (c *Cache) remove(e *cached) {
	c.unlink(e)
	delete(e.t.decoded, e.unit)
	if len(e.t.decoded) == 0 {
		e.t.decoded = nil // a map keeps its room after deletes
	}
	c.bytes -= e.size
	c.n--
}

func (c *Cache) unlink(e *cached) {
	if e.next == e {
		c.head = nil
	} else {
		e.prev.next, e.next.prev = e.next, e.prev
		if c.head == e {
			c.head = e.next
		}
	}
	e.prev, e.next = nil, nil
}

func (c *Cache) pushFront(e *cached) {
	if c.head == nil {
		e.prev, e.next = e, e
	} else {
		e.prev, e.next = c.head.prev, c.head
		c.head.prev.next = e
		c.head.prev = e
	}
	c.head = e
}
