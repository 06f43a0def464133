package symbolize

import "math"

// lru is a cache bounded in entries and in bytes. Entries live in one slice that
// grows as the cache fills, never allocated at full capacity up front, and the list
// that orders them by use is made of indexes into it: no allocation per entry, and
// nothing for the collector to follow but what the values hold.
type lru[K comparable, V any] struct {
	index      map[K]int32
	slots      []slot[K, V]
	head, free int32 // most recently used entry and first free slot, or none
	bytes      int64
	maxBytes   int64 // bound on bytes; 0 for none
	maxLen     int   // bound on entries
	onEvict    func(K, V)
}

const none = -1

type slot[K comparable, V any] struct {
	key        K
	val        V
	size       int64
	prev, next int32 // around the list, circular; next links free slots
}

// newLRU returns a cache of at most maxLen entries and maxBytes bytes (0: no bound in
// bytes). onEvict, if set, is called for each entry the bounds push out, and for
// each entry Clear drops; not for those Remove drops, nor for a value Add replaces.
func newLRU[K comparable, V any](maxLen int, maxBytes int64, onEvict func(K, V)) *lru[K, V] {
	return &lru[K, V]{
		index:    map[K]int32{},
		head:     none,
		free:     none,
		maxBytes: maxBytes,
		maxLen:   min(max(maxLen, 1), math.MaxInt32),
		onEvict:  onEvict,
	}
}

// Len is the number of entries held.
func (c *lru[K, V]) Len() int { return len(c.index) }

// Bytes is the sum of the sizes of the entries held.
func (c *lru[K, V]) Bytes() int64 { return c.bytes }

// Each calls f with every entry, in no order, leaving the order of use as it is.
func (c *lru[K, V]) Each(f func(K, V)) {
	for k, i := range c.index {
		f(k, c.slots[i].val)
	}
}

// Has reports whether k is held, leaving the order of use as it is.
func (c *lru[K, V]) Has(k K) bool {
	_, ok := c.index[k]
	return ok
}

// Get returns the value for k and makes it the most recently used.
func (c *lru[K, V]) Get(k K) (V, bool) {
	i, ok := c.index[k]
	if !ok {
		var zero V
		return zero, false
	}
	c.unlink(i)
	c.pushFront(i)
	return c.slots[i].val, true
}

// Add sets the value for k, the most recently used, and evicts the least recently
// used entries until the cache is within its bounds again; the entry just added
// stays even when it alone exceeds them.
func (c *lru[K, V]) Add(k K, v V, size int64) {
	if i, ok := c.index[k]; ok {
		s := &c.slots[i]
		c.bytes += size - s.size
		s.val, s.size = v, size
		c.unlink(i)
		c.pushFront(i)
	} else {
		i := c.alloc()
		c.slots[i] = slot[K, V]{key: k, val: v, size: size}
		c.index[k] = i
		c.bytes += size
		c.pushFront(i)
	}
	for len(c.index) > 1 && (len(c.index) > c.maxLen || (c.maxBytes > 0 && c.bytes > c.maxBytes)) {
		tail := c.slots[c.head].prev
		s := c.slots[tail]
		c.drop(tail)
		if c.onEvict != nil {
			c.onEvict(s.key, s.val)
		}
	}
}

// Remove drops k's entry, if any, without calling onEvict.
func (c *lru[K, V]) Remove(k K) (V, bool) {
	i, ok := c.index[k]
	if !ok {
		var zero V
		return zero, false
	}
	v := c.slots[i].val
	c.drop(i)
	return v, true
}

// Clear drops every entry, calling onEvict for each, and lets the memory go.
func (c *lru[K, V]) Clear() {
	slots := c.slots
	head := c.head
	c.index, c.slots, c.head, c.free, c.bytes = map[K]int32{}, nil, none, none, 0
	if c.onEvict == nil || head == none {
		return
	}
	for i := head; ; {
		c.onEvict(slots[i].key, slots[i].val)
		if i = slots[i].next; i == head {
			return
		}
	}
}

func (c *lru[K, V]) alloc() int32 {
	if c.free != none {
		i := c.free
		c.free = c.slots[i].next
		return i
	}
	c.slots = append(c.slots, slot[K, V]{})
	return int32(len(c.slots) - 1)
}

func (c *lru[K, V]) drop(i int32) {
	s := &c.slots[i]
	delete(c.index, s.key)
	c.bytes -= s.size
	c.unlink(i)
	*s = slot[K, V]{next: c.free} // the value's memory goes with it
	c.free = i
}

func (c *lru[K, V]) unlink(i int32) {
	s := &c.slots[i]
	if s.next == i {
		c.head = none
		return
	}
	c.slots[s.prev].next = s.next
	c.slots[s.next].prev = s.prev
	if c.head == i {
		c.head = s.next
	}
}

func (c *lru[K, V]) pushFront(i int32) {
	s := &c.slots[i]
	if c.head == none {
		s.prev, s.next = i, i
	} else {
		h := &c.slots[c.head]
		s.prev, s.next = h.prev, c.head
		c.slots[h.prev].next = i
		h.prev = i
	}
	c.head = i
}

// RemoveFunc drops every entry whose key drop accepts, without calling onEvict. It
// walks the whole cache: for rare events.
func (c *lru[K, V]) RemoveFunc(drop func(K) bool) {
	for k, i := range c.index {
		if drop(k) {
			c.drop(i)
		}
	}
}
