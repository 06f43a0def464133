package interp

import (
	"context"
	"sync"
	"time"

	"github.com/sonde-profiler/sonde/internal/lru"
	"github.com/sonde-profiler/sonde/internal/readqueue"
)

// CodeKey is a runtime's code in an image: an address means something in one exec of one
// process only.
type CodeKey struct{ Image, Code uint64 }

// CodesConfig configures Codes: how a runtime reads its code, and how much of it is kept.
type CodesConfig[E any] struct {
	// MaxCodes bounds the entries kept, read or failed; MaxPending the codes waiting to be
	// read. Both must be positive.
	MaxCodes, MaxPending int
	// MaxBytes bounds what the entries keep, as Size counts it; 0: MaxCodes alone.
	MaxBytes int
	Size     func(E) int
	// MaxIdle lets entries no stack showed for so long go; 0: they stay while there is room.
	MaxIdle time.Duration
	// Recheck is how long a read is trusted before the code is checked again, when next
	// seen, for other code at its address.
	Recheck time.Duration
	// Read reads code of a process: queued for what SeenCode queued, false for a read that
	// naming cannot wait for. gone says the process (this exec of it) is no longer there.
	Read func(pid uint32, k CodeKey, queued bool) (e E, gone bool)
	// Recheckable tells whether an entry is worth checking again (it was read); nil: all are.
	Recheckable func(E) bool
	// Failed tells an entry whose read failed; nil: none do. A read can fail for a while
	// and then succeed (V8 had not installed the function's code yet, an object was being
	// moved): a failed entry is read again when seen or named once Retry has passed since,
	// at most once per Retry. Retry 0 keeps failures.
	Failed func(E) bool
	Retry  time.Duration
	// Same tells whether code read before is still what runs at its address; decided false
	// leaves the entry be (nothing to compare it with).
	Same func(pid uint32, k CodeKey, old E) (same, decided bool)
	// Touch counts a stack that shows known code as a use, for MaxIdle and the order of
	// eviction; otherwise only naming does.
	Touch bool
	// OnReuse hears that an image's runtime gave a code address to other code: the
	// aggregator's RenewImage, so that old locations keep their names and new ones are made
	// for what runs now.
	OnReuse func(pid uint32, image uint64)
	// Now is time.Now, unless a test says otherwise.
	Now func() time.Time
}

// CodeStats counts what Codes did.
type CodeStats struct {
	Dropped  uint64 // codes not read early for a full queue
	Rechecks uint64 // codes checked again for a reused address
	Reused   uint64 // addresses found holding other code than the one named
	Idle     uint64 // entries gone after MaxIdle without a use
	Retries  uint64 // failed reads tried again
	Cached   int    // entries kept
	Bytes    int    // what they keep, as Size counts it
}

// Codes is what a runtime's namer read of the code its frames show: read as soon as a stack
// shows it (Seen, a reader goroutine in Run), so that the process is most likely still
// there; checked again now and then for other code at its address; taken by naming (Get),
// which reads what was missed then. It is safe for concurrent use.
type Codes[E any] struct {
	cfg   CodesConfig[E]
	mu    sync.Mutex
	codes *lru.LRU[CodeKey, *entry[E]]
	bytes int // of what codes keeps, kept by its eviction callback under mu
	queue *readqueue.Queue[CodeKey, pendingRead[E]]
	stats CodeStats
}

type entry[E any] struct {
	value         E
	checked, used time.Time
}

type pendingRead[E any] struct {
	pid   uint32
	check *entry[E] // a recheck of this entry; nil: a first read
}

// NewCodes returns Codes; Run reads what Seen queues.
func NewCodes[E any](cfg CodesConfig[E]) *Codes[E] {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Codes[E]{cfg: cfg, codes: lru.New[CodeKey, *entry[E]](cfg.MaxCodes), queue: readqueue.New[CodeKey, pendingRead[E]](cfg.MaxPending)}
	c.codes.SetOnEvict(func(_ CodeKey, e *entry[E]) { c.bytes -= c.size(e.value) })
	return c
}

func (c *Codes[E]) size(e E) int {
	if c.cfg.Size == nil {
		return 0
	}
	return c.cfg.Size(e)
}

// add keeps e for k within the bounds, and lets what no stack showed for MaxIdle go; c.mu
// is held. The cache's order is that of use: the idle are the oldest.
func (c *Codes[E]) add(k CodeKey, e *entry[E]) {
	c.codes.Remove(k)
	c.codes.Add(k, e)
	c.bytes += c.size(e.value)
	for c.cfg.MaxBytes > 0 && c.bytes > c.cfg.MaxBytes {
		if _, _, ok := c.codes.RemoveOldest(); !ok {
			break
		}
	}
	for c.cfg.MaxIdle > 0 {
		_, old, ok := c.codes.Oldest()
		if !ok || e.used.Sub(old.used) < c.cfg.MaxIdle {
			break
		}
		c.codes.RemoveOldest()
		c.stats.Idle++
	}
}

// Seen queues k's code to be read, unless it is known or queued already; code read long
// enough ago is queued to be checked again.
func (c *Codes[E]) Seen(pid uint32, k CodeKey) {
	if c.queue.Queued(k) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var check *entry[E]
	get := c.codes.Peek
	if c.cfg.Touch {
		get = c.codes.Get
	}
	if e, ok := get(k); ok {
		now := c.cfg.Now()
		if c.cfg.Touch {
			e.used = now
		}
		switch {
		case c.retry(e, now):
			// Read afresh, as a first read: check stays nil.
		case (c.cfg.Recheckable != nil && !c.cfg.Recheckable(e.value)) || now.Sub(e.checked) < c.cfg.Recheck:
			return
		default:
			check = e
		}
	}
	if !c.queue.Push(k, pendingRead[E]{pid: pid, check: check}) {
		c.stats.Dropped++
	}
}

// Run reads what Seen queued until ctx ends.
func (c *Codes[E]) Run(ctx context.Context) error {
	return c.queue.Run(ctx, func(k CodeKey, p pendingRead[E]) {
		if p.check == nil {
			c.mu.Lock()
			old, had := c.codes.Peek(k)
			if had && !c.retry(old, c.cfg.Now()) {
				c.mu.Unlock()
				return // read meanwhile, by naming
			}
			if had {
				c.stats.Retries++
			}
			c.mu.Unlock()
			v, _ := c.cfg.Read(p.pid, k, true)
			now := c.cfg.Now()
			c.mu.Lock()
			c.add(k, &entry[E]{value: v, checked: now, used: now})
			c.mu.Unlock()
			return
		}
		same, decided := c.cfg.Same(p.pid, k, p.check.value)
		if !decided {
			return
		}
		c.mu.Lock()
		c.stats.Rechecks++
		if same {
			p.check.checked = c.cfg.Now()
			c.mu.Unlock()
			return
		}
		// Other code, or none any more: what runs there now is read when next named.
		c.stats.Reused++
		c.codes.Remove(k)
		c.mu.Unlock()
		if c.cfg.OnReuse != nil {
			c.cfg.OnReuse(p.pid, k.Image)
		}
	})
}

// Get returns what was read of k's code, reading it now if it was not; known says it was.
func (c *Codes[E]) Get(pid uint32, k CodeKey) (v E, known bool) {
	c.mu.Lock()
	e, ok := c.codes.Get(k)
	retry := false
	if ok {
		e.used = c.cfg.Now()
		if retry = c.retry(e, e.used); retry {
			c.stats.Retries++
		}
	}
	c.mu.Unlock()
	if ok && !retry {
		return e.value, true
	}
	v, _ = c.cfg.Read(pid, k, false)
	now := c.cfg.Now()
	c.mu.Lock()
	c.add(k, &entry[E]{value: v, checked: now, used: now})
	c.mu.Unlock()
	return v, false
}

// retry tells whether a failed entry is due another read; c.mu is held.
func (c *Codes[E]) retry(e *entry[E], now time.Time) bool {
	return c.cfg.Failed != nil && c.cfg.Retry > 0 && c.cfg.Failed(e.value) && now.Sub(e.checked) >= c.cfg.Retry
}

// Pending is how many codes wait to be read.
func (c *Codes[E]) Pending() int { return c.queue.Len() }

// Stats returns the counts so far.
func (c *Codes[E]) Stats() CodeStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Cached, s.Bytes = c.codes.Len(), c.bytes
	return s
}
