package readqueue

import (
	"context"
	"slices"
	"testing"
	"time"
)

// Keys are read once each, in order, a key waiting is not queued twice, a full queue
// refuses, and a key read can be queued again.
func TestQueue(t *testing.T) {
	q := New[int, string](3)
	for _, k := range []int{1, 2, 1, 3} {
		if !q.Push(k, "v") {
			t.Fatalf("push %d refused", k)
		}
	}
	if q.Push(4, "v") {
		t.Fatal("a fourth key queued in a queue of three")
	}
	if !q.Queued(2) || q.Queued(4) {
		t.Fatal("Queued does not tell what waits")
	}
	ctx, cancel := context.WithCancel(context.Background())
	read := make(chan int, 10)
	done := make(chan error, 1)
	go func() {
		done <- q.Run(ctx, func(k int, v string) {
			if v != "v" {
				t.Errorf("key %d read with %q", k, v)
			}
			read <- k
		})
	}()
	var got []int
	for range 3 {
		got = append(got, <-read)
	}
	if !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("read %v, want [1 2 3]", got)
	}
	// A key once read queues again, and wakes the reader.
	deadline := time.Now().Add(10 * time.Second)
	for q.Queued(1) {
		if time.Now().After(deadline) {
			t.Fatal("key 1 still queued after its read")
		}
		time.Sleep(time.Millisecond)
	}
	q.Push(1, "v")
	if k := <-read; k != 1 {
		t.Errorf("read %d, want 1 again", k)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
