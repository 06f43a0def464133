// Package lru is a map of bounded size that lets go of its least recently used entry
// when full. It allocates for the entries it holds, as they come: a cache sized for the
// worst case costs nothing on a host that never fills it (a Python namer on a host
// without Python), where a preallocated one held megabytes from the start.
package lru

// LRU is not safe for concurrent use.
type LRU[K comparable, V any] struct {
	capacity int
	index    map[K]int32
	// nodes[0] is the sentinel of a circular list, most recently used first: its
	// next is the newest entry, its prev the oldest. Removed nodes are chained
	// from free through next.
	nodes   []node[K, V]
	free    int32
	onEvict func(K, V)
}

type node[K comparable, V any] struct {
	key        K
	value      V
	prev, next int32
}

// New returns an LRU of at most capacity entries (at least 1).
func New[K comparable, V any](capacity int) *LRU[K, V] {
	capacity = max(capacity, 1)
	return &LRU[K, V]{capacity: capacity, index: make(map[K]int32), nodes: make([]node[K, V], 1)}
}

// SetOnEvict sets f to hear of every entry that leaves: pushed out by Add, Remove,
// RemoveOldest or Purge. A value Add replaces under the same key is not reported.
func (l *LRU[K, V]) SetOnEvict(f func(K, V)) { l.onEvict = f }

// Len is the number of entries held.
func (l *LRU[K, V]) Len() int { return len(l.index) }

// Cap is the most entries held.
func (l *LRU[K, V]) Cap() int { return l.capacity }

// Get returns the value of key and makes it the most recently used.
func (l *LRU[K, V]) Get(key K) (V, bool) {
	i, ok := l.index[key]
	if !ok {
		var zero V
		return zero, false
	}
	l.unlink(i)
	l.pushFront(i)
	return l.nodes[i].value, true
}

// Peek returns the value of key without making it more recently used.
func (l *LRU[K, V]) Peek(key K) (V, bool) {
	i, ok := l.index[key]
	if !ok {
		var zero V
		return zero, false
	}
	return l.nodes[i].value, true
}

// Add stores value under key, the most recently used, and reports whether the oldest
// entry went to make room.
func (l *LRU[K, V]) Add(key K, value V) (evicted bool) {
	if i, ok := l.index[key]; ok {
		l.nodes[i].value = value
		l.unlink(i)
		l.pushFront(i)
		return false
	}
	if len(l.index) >= l.capacity {
		l.RemoveOldest()
		evicted = true
	}
	var i int32
	if l.free != 0 {
		i = l.free
		l.free = l.nodes[i].next
	} else {
		l.nodes = append(l.nodes, node[K, V]{})
		i = int32(len(l.nodes) - 1)
	}
	l.nodes[i].key, l.nodes[i].value = key, value
	l.pushFront(i)
	l.index[key] = i
	return evicted
}

// Remove deletes key and reports whether it was there.
func (l *LRU[K, V]) Remove(key K) bool {
	i, ok := l.index[key]
	if ok {
		l.removeAt(i)
	}
	return ok
}

// RemoveOldest deletes the least recently used entry and returns it.
func (l *LRU[K, V]) RemoveOldest() (key K, value V, ok bool) {
	i := l.nodes[0].prev
	if i == 0 {
		return key, value, false
	}
	key, value = l.nodes[i].key, l.nodes[i].value
	l.removeAt(i)
	return key, value, true
}

// Oldest returns the least recently used entry without using it.
func (l *LRU[K, V]) Oldest() (key K, value V, ok bool) {
	i := l.nodes[0].prev
	if i == 0 {
		return key, value, false
	}
	return l.nodes[i].key, l.nodes[i].value, true
}

// Keys returns the keys, oldest first.
func (l *LRU[K, V]) Keys() []K {
	keys := make([]K, 0, len(l.index))
	for i := l.nodes[0].prev; i != 0; i = l.nodes[i].prev {
		keys = append(keys, l.nodes[i].key)
	}
	return keys
}

// Purge deletes every entry and gives back the memory they took.
func (l *LRU[K, V]) Purge() {
	for l.Len() > 0 {
		l.RemoveOldest()
	}
	l.index = make(map[K]int32)
	l.nodes = make([]node[K, V], 1)
	l.free = 0
}

func (l *LRU[K, V]) removeAt(i int32) {
	n := &l.nodes[i]
	key, value := n.key, n.value
	l.unlink(i)
	delete(l.index, key)
	var zero node[K, V]
	*n = zero // what the values point to goes with them
	n.next = l.free
	l.free = i
	if l.onEvict != nil {
		l.onEvict(key, value)
	}
}

func (l *LRU[K, V]) unlink(i int32) {
	n := &l.nodes[i]
	l.nodes[n.prev].next = n.next
	l.nodes[n.next].prev = n.prev
	n.prev, n.next = 0, 0
}

func (l *LRU[K, V]) pushFront(i int32) {
	first := l.nodes[0].next
	l.nodes[i].prev, l.nodes[i].next = 0, first
	l.nodes[first].prev = i
	l.nodes[0].next = i
}
