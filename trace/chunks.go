package trace

import (
	"fmt"
	"hash/maphash"
	"slices"
	"unsafe"

	"github.com/elastic/go-freelru"
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
}

// chunker cuts stacks into chunks and interns them in a hash-LRU. It is not safe for
// concurrent use; the Collector's lock guards it.
type chunker struct {
	size int
	lru  *freelru.LRU[uint64, *chunk]
	seed maphash.Seed
	// collisions counts distinct chunks that hashed alike: the later one stays out of the
	// cache, correct but unshared.
	collisions uint64
	// hits, misses and evictions count the cache's lookups and what it pushed out.
	hits, misses, evictions uint64
	// onEvict hears of each chunk the cache lets go of.
	onEvict func(*chunk)
}

func newChunker(size, capacity int) (*chunker, error) {
	if size < 1 || capacity < 1 || capacity > 1<<30 {
		return nil, fmt.Errorf("chunk size %d and cache capacity %d must be positive", size, capacity)
	}
	seed := maphash.MakeSeed()
	// The key is the chunk's 64-bit hash already: its two halves folded are the table's.
	// A table a quarter larger than the capacity keeps the buckets short.
	cache, err := freelru.NewWithSize[uint64, *chunk](uint32(capacity), uint32(capacity+capacity/4),
		func(h uint64) uint32 { return uint32(h ^ h>>32) })
	if err != nil {
		return nil, fmt.Errorf("chunk cache: %w", err)
	}
	c := &chunker{size: size, lru: cache, seed: seed}
	cache.SetOnEvict(func(_ uint64, ch *chunk) {
		ch.cached = false
		if c.onEvict != nil {
			c.onEvict(ch)
		}
	})
	return c, nil
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
	if ch, ok := c.lru.Get(hash); ok {
		c.hits++
		if ch.space == space && slices.Equal(ch.frames, frames) {
			return ch
		}
		c.collisions++
		return &chunk{hash: hash, space: space, frames: slices.Clone(frames)}
	}
	c.misses++
	ch := &chunk{hash: hash, space: space, frames: slices.Clone(frames), cached: true}
	if c.lru.Add(hash, ch) {
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
	for _, h := range c.lru.Keys() {
		if ch, ok := c.lru.Peek(h); ok && dead[ch.space] {
			c.lru.Remove(h)
			n++
		}
	}
	return n
}
