// Package readqueue is what the language runtimes' namers read from processes while they
// live: each key queued once until read, in order, up to a bound, and read in batches by
// one goroutine that sleeps while there is nothing to read.
package readqueue

import (
	"context"
	"sync"
)

// Queue holds keys waiting to be read, each with what its reader needs. It is safe for
// concurrent use; one goroutine runs Run.
type Queue[K comparable, V any] struct {
	mu     sync.Mutex
	max    int
	items  []item[K, V]
	queued map[K]struct{}
	wake   chan struct{}
}

type item[K comparable, V any] struct {
	key K
	val V
}

// New returns a queue holding at most max keys.
func New[K comparable, V any](max int) *Queue[K, V] {
	return &Queue[K, V]{max: max, queued: map[K]struct{}{}, wake: make(chan struct{}, 1)}
}

// Push queues k with v, unless k waits already (or is being read). It returns false when
// the queue is full: k was not queued.
func (q *Queue[K, V]) Push(k K, v V) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.queued[k]; ok {
		return true
	}
	if len(q.items) >= q.max {
		return false
	}
	q.queued[k] = struct{}{}
	q.items = append(q.items, item[K, V]{k, v})
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return true
}

// Queued tells whether k waits to be read, or is being read.
func (q *Queue[K, V]) Queued(k K) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	_, ok := q.queued[k]
	return ok
}

// Len is how many keys wait to be read or are being read.
func (q *Queue[K, V]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queued)
}

// Run calls read with each key queued, in the order queued, until ctx ends. A key can be
// queued again once its read has returned.
func (q *Queue[K, V]) Run(ctx context.Context, read func(k K, v V)) error {
	for {
		q.mu.Lock()
		batch := q.items
		q.items = nil
		q.mu.Unlock()
		for _, it := range batch {
			if ctx.Err() != nil {
				return nil
			}
			read(it.key, it.val)
			q.mu.Lock()
			delete(q.queued, it.key)
			q.mu.Unlock()
		}
		if len(batch) > 0 {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-q.wake:
		}
	}
}
