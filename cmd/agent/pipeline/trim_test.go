package pipeline

import (
	"runtime"
	"testing"
	"time"
)

// An interval's end trims the heap at most every heapTrimEvery, and never while the live
// heap is large.
func TestHeapTrimmer(t *testing.T) {
	var freed int
	live := uint64(4 << 20)
	h := &heapTrimmer{free: func() { freed++ }, live: func() uint64 { return live }}
	t0 := time.Unix(1_000_000, 0)
	for _, step := range []struct {
		at    time.Duration
		live  uint64
		freed int
	}{
		{0, 4 << 20, 1},           // the first interval's end
		{time.Second, 4 << 20, 1}, // too soon after it
		{heapTrimEvery - time.Millisecond, 4 << 20, 1},
		{heapTrimEvery, 4 << 20, 2},                         // due
		{2 * heapTrimEvery, heapTrimMaxLive + 1, 2},         // due, but the heap is large
		{2*heapTrimEvery + time.Second, heapTrimMaxLive, 3}, // still due, and small again
	} {
		live = step.live
		h.intervalDone(t0.Add(step.at))
		if freed != step.freed {
			t.Fatalf("at %v, live %d: %d trims, want %d", step.at, step.live, freed, step.freed)
		}
	}
}

// The trimmer made for the agent reads a live heap from the runtime (as of the last
// collection: none before the first).
func TestHeapTrimmerReadsLiveHeap(t *testing.T) {
	runtime.GC()
	h := newHeapTrimmer()
	if h.live() == 0 {
		t.Error("no live heap read from runtime/metrics")
	}
}
