package encoding

import (
	"fmt"
	"sort"

	"github.com/sonde-profiler/sonde/internal/lru"
)

// KernelModel prices one sample record on the BPF ring buffer.
type KernelModel struct {
	Header int // bytes before the frames: pid, tid, time, comm, lengths
	Frame  int // bytes per frame address
	Hash   int // bytes per chunk reference
}

// DefaultKernelModel is the model: a 48-byte header, 8-byte frames and
// 8-byte chunk hashes, records as long as their content. (sonde's record today has a
// 56-byte header and a fixed length of 2096 bytes: room for 128 user and 127 kernel
// frames whatever the depth.)
var DefaultKernelModel = KernelModel{Header: 48, Frame: 8, Hash: 8}

// KernelResult is what SimulateKernel measured.
type KernelResult struct {
	ChunkSize, LRUSize int
	Events             int64 // samples replayed
	// Bytes on the ring today (header and every frame) and with chunk hashes (header,
	// a hash per chunk, and the frames of chunks the LRU did not hold).
	Today, Proposed int64
	// The same for the samples at least MinDepth frames deep.
	MinDepth                int
	DeepEvents              int64
	DeepToday, DeepProposed int64
	ChunkHits, ChunkMisses  int64
	Collisions              int // distinct chunks whose 64-bit hashes collided
	DistinctChunks          int
	LRUFilled               int // entries in the LRU at the end
}

// Saving is the fraction of ring bytes the chunk hashes save, over all samples.
func (r KernelResult) Saving() float64 { return 1 - float64(r.Proposed)/float64(r.Today) }

// DeepSaving is Saving over the samples at least MinDepth deep; 0 when there are none.
func (r KernelResult) DeepSaving() float64 {
	if r.DeepToday == 0 {
		return 0
	}
	return 1 - float64(r.DeepProposed)/float64(r.DeepToday)
}

// SimulateKernel replays c's samples in capture order through a kernel that keeps
// the hashes of recently sent chunks in an LRU map of lruSize entries: a chunk it
// holds is sent as its hash only, any other as hash and frames (then remembered).
// Chunks are cut as in the chunked encoding, anchored at the root. Location indices
// stand in for frame addresses: sonde gives one location to one address in one
// mapping, so equal chunks of addresses are equal chunks of locations.
//
// The LRU is exact and shared by all CPUs; BPF's LRU_HASH approximates LRU order with
// per-CPU lists, so it keeps somewhat less than lruSize recent entries in practice.
func SimulateKernel(c *Corpus, m KernelModel, chunkSize, lruSize, minDepth int) (KernelResult, error) {
	r := KernelResult{ChunkSize: chunkSize, LRUSize: lruSize, MinDepth: minDepth}
	if chunkSize < 1 || lruSize < 1 {
		return r, fmt.Errorf("simulate kernel: chunk size %d and LRU size %d must be positive", chunkSize, lruSize)
	}
	cache := lru.New[uint64, struct{}](lruSize)
	// contents checks the 64-bit hashes for collisions, which the kernel could not.
	contents := make(map[uint64]string)
	var key []byte
	for _, idx := range arrivalOrder(c) {
		stack := c.Samples[idx].Stack
		today := int64(m.Header + m.Frame*len(stack))
		proposed := int64(m.Header)
		first := len(stack) % chunkSize
		if first == 0 {
			first = chunkSize
		}
		for lo, hi := 0, first; lo < len(stack); lo, hi = hi, hi+chunkSize {
			chunk := stack[lo:hi]
			h := uint64(hashSeed)
			for _, l := range chunk {
				h = hashStep(h, l)
			}
			key = appendStackKey(key[:0], chunk)
			if have, ok := contents[h]; !ok {
				contents[h] = string(key)
			} else if have != string(key) {
				r.Collisions++
			}
			proposed += int64(m.Hash)
			if _, ok := cache.Get(h); ok {
				r.ChunkHits++
				continue
			}
			r.ChunkMisses++
			proposed += int64(m.Frame * len(chunk))
			cache.Add(h, struct{}{})
		}
		r.Events++
		r.Today += today
		r.Proposed += proposed
		if len(stack) >= minDepth {
			r.DeepEvents++
			r.DeepToday += today
			r.DeepProposed += proposed
		}
	}
	r.DistinctChunks = len(contents)
	r.LRUFilled = cache.Len()
	return r, nil
}

// arrivalOrder lists sample indices once per sample taken, in the order they were
// taken when the fixture has timestamps, else record by record.
func arrivalOrder(c *Corpus) []int {
	type event struct {
		t   uint64
		idx int
	}
	var events []event
	timed := true
	for i, s := range c.Samples {
		if int64(len(s.Times)) != s.Count {
			timed = false
		}
		for j := int64(0); j < s.Count; j++ {
			var t uint64
			if j < int64(len(s.Times)) {
				t = s.Times[j]
			}
			events = append(events, event{t, i})
		}
	}
	if timed {
		sort.SliceStable(events, func(a, b int) bool { return events[a].t < events[b].t })
	}
	out := make([]int, len(events))
	for i, e := range events {
		out[i] = e.idx
	}
	return out
}
