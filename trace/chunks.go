package trace

import (
	"fmt"
	"hash/maphash"
	"slices"
	"unsafe"
)

// Defaults for chunk interning. Eight frames per chunk keep a stack of typical depth (15-30)
// to two to four chunks, while the long shared prefixes of deep stacks collapse into a few
// shared chunks; the cache holds the chunks of tens of thousands of distinct stacks.
const (
	DefaultChunkSize     = 8
	DefaultChunkCapacity = 1 << 16
)

// chunk is a run of consecutive frames of a stack, cut at fixed positions counted from
// the root, so that stacks sharing a prefix share whole chunks. Chunks are interned: one
// object per distinct run in an address space, shared by every stack that contains it.
type chunk struct {
	hash uint64
	// space is the address space the frames belong to: user addresses mean something only
	// within one image (one exec of one process).
	space  uint64
	frames []uint64 // leaf first, like the stack

	// locs are the frames resolved to locations by the first flush that reports the
	// chunk, and kept with it: a chunk is resolved, and its locations named, once while it
	// stays cached, however many samples and intervals report it.
	locs []*Location
	// unresolved counts the user frames no reading of the image covered when resolvedWith
	// was its latest; a later reading tries them again.
	unresolved   int
	resolvedWith *snapshot
	// listed is the last flush whose Profile lists the chunk's locations.
	listed uint64
	// cached is true while the chunk cache holds the chunk, and with it a reference to
	// each of its locations.
	cached bool
	// older and newer are the chunk's neighbours in the cache's recency list.
	older, newer *chunk
}

// chunker cuts stacks into chunks and interns them in a hash-LRU. It is not safe for
// concurrent use; the Collector's lock guards it.
type chunker struct {
	size int
	lru  chunkLRU
	seed maphash.Seed
	// collisions counts distinct chunks that hashed alike: the later one stays out of the
	// cache, correct but unshared.
	collisions uint64
	// hits, misses and evictions count the cache's lookups and what it pushed out.
	hits, misses, evictions uint64
}

func newChunker(size, capacity int) (*chunker, error) {
	if size < 1 || capacity < 1 || capacity > 1<<30 {
		return nil, fmt.Errorf("chunk size %d and cache capacity %d must be positive", size, capacity)
	}
	c := &chunker{size: size, seed: maphash.MakeSeed()}
	c.lru.init(capacity)
	return c, nil
}

// chunkLRU is the chunk cache: chunks by hash, and a list through the chunks from the
// least recently used to the most. Its table grows with what it holds, up to the
// capacity, and shrinks when most of it went: a table made for the capacity up front
// (the 33 000 chunks of the default budget took 2.1 MB) cost a host with a few thousand
// distinct stacks a fifth of sonde's heap for nothing.
type chunkLRU struct {
	byHash   map[uint64]*chunk
	capacity int
	// list is the sentinel of the recency list: list.newer is the oldest chunk,
	// list.older the newest.
	list chunk
	// peak is the most chunks the table held since it was made.
	peak int
	// onEvict hears of each chunk the cache lets go of, whatever the reason.
	onEvict func(*chunk)
}

func (l *chunkLRU) init(capacity int) {
	l.capacity = capacity
	l.byHash = map[uint64]*chunk{}
	l.list.older, l.list.newer = &l.list, &l.list
}

func (l *chunkLRU) len() int { return len(l.byHash) }

// get returns the chunk cached under hash and makes it the newest.
func (l *chunkLRU) get(hash uint64) (*chunk, bool) {
	ch, ok := l.byHash[hash]
	if !ok {
		return nil, false
	}
	l.unlink(ch)
	l.pushNewest(ch)
	return ch, true
}

// add caches ch, which no cached chunk shares a hash with, as the newest, and reports
// whether the oldest went to make room.
func (l *chunkLRU) add(ch *chunk) (evicted bool) {
	if len(l.byHash) >= l.capacity {
		l.remove(l.list.newer)
		evicted = true
	}
	ch.cached = true
	l.byHash[ch.hash] = ch
	l.pushNewest(ch)
	l.peak = max(l.peak, len(l.byHash))
	return evicted
}

// oldest returns the least recently used chunk, nil when the cache is empty.
func (l *chunkLRU) oldest() *chunk { return l.next(&l.list) }

// next returns the chunk used next after ch, nil after the newest.
func (l *chunkLRU) next(ch *chunk) *chunk {
	if ch.newer == &l.list {
		return nil
	}
	return ch.newer
}

// remove takes a cached chunk out and tells onEvict.
func (l *chunkLRU) remove(ch *chunk) {
	delete(l.byHash, ch.hash)
	l.unlink(ch)
	ch.cached = false
	if l.onEvict != nil {
		l.onEvict(ch)
	}
}

// shrink makes the table again when it holds less than a quarter of what it held at
// its largest: a map keeps the room it grew to, and a burst of distinct stacks (a build,
// a deploy) would otherwise keep its table for the agent's life.
func (l *chunkLRU) shrink() {
	const least = 1024 // below this a table costs too little to make again
	if l.peak < least || len(l.byHash)*4 > l.peak {
		return
	}
	m := make(map[uint64]*chunk, len(l.byHash))
	for h, ch := range l.byHash {
		m[h] = ch
	}
	l.byHash, l.peak = m, len(m)
}

func (l *chunkLRU) unlink(ch *chunk) {
	ch.older.newer, ch.newer.older = ch.newer, ch.older
	ch.older, ch.newer = nil, nil
}

func (l *chunkLRU) pushNewest(ch *chunk) {
	ch.older, ch.newer = l.list.older, &l.list
	l.list.older.newer = ch
	l.list.older = ch
}

// bounds returns the [lo, hi) index ranges of a leaf-first stack of n frames cut into
// chunks of size frames anchored at the root (index n-1): the root chunk first, the
// leaf chunk, possibly shorter, last.
func chunkBounds(n, size int, dst [][2]int) [][2]int {
	dst = dst[:0]
	for hi := n; hi > 0; hi -= size {
		dst = append(dst, [2]int{max(hi-size, 0), hi})
	}
	return dst
}

// hashFrames hashes a run of frames together with its address space.
func (c *chunker) hashFrames(space uint64, frames []uint64) uint64 {
	var h uint64
	if len(frames) > 0 {
		h = maphash.Bytes(c.seed, unsafe.Slice((*byte)(unsafe.Pointer(&frames[0])), len(frames)*8))
	}
	return mix(h ^ space*0x9e3779b97f4a7c15)
}

// mix is a 64-bit finalizer (murmur3's fmix64): a bijection that spreads every input bit
// over the output, enough to combine hashes that are already uniform.
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// intern returns the shared chunk for frames, creating it on a miss.
func (c *chunker) intern(space, hash uint64, frames []uint64) *chunk {
	if ch, ok := c.lru.get(hash); ok {
		c.hits++
		if ch.space == space && slices.Equal(ch.frames, frames) {
			return ch
		}
		c.collisions++
		return &chunk{hash: hash, space: space, frames: slices.Clone(frames)}
	}
	c.misses++
	ch := &chunk{hash: hash, space: space, frames: slices.Clone(frames)}
	if c.lru.add(ch) {
		c.evictions++
	}
	return ch
}

// forgetSpaces drops the cached chunks of address spaces no sample can come from again
// (images the process tracker forgot) and reports how many went. Left to the LRU, they
// would stay until pushed out, and a host that starts processes all day long would keep
// the cache full of the frames and locations of programs long gone.
func (c *chunker) forgetSpaces(dead map[uint64]bool) int {
	n := 0
	for ch := c.lru.oldest(); ch != nil; {
		next := c.lru.next(ch)
		if dead[ch.space] {
			c.lru.remove(ch)
			n++
		}
		ch = next
	}
	return n
}
