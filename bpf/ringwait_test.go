package bpf

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// A ring buffer's descriptor goes into Go's poller (else the reader would fall back to
// a blocking epoll_wait, and the runtime's monitor thread would spin after it); a wait
// ends at its deadline, and an interrupt ends it and every later one at once.
func TestRingWaiter(t *testing.T) {
	testenv.RequireRoot(t)
	ring, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.RingBuf, MaxEntries: 4096})
	if err != nil {
		t.Fatalf("ring buffer map: %v", err)
	}
	defer ring.Close()
	w, err := newRingWaiter(ring.FD())
	if err != nil {
		t.Fatalf("the poller refused the ring buffer: %v", err)
	}
	defer w.close()
	start := time.Now()
	if err := w.wait(50 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Errorf("an empty ring's wait ended after %v, before its deadline", took)
	}
	done := make(chan error, 1)
	go func() { done <- w.wait(time.Hour) }()
	time.Sleep(10 * time.Millisecond) // most likely parked by now; either way it must end
	w.interrupt()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testenv.StartTimeout):
		t.Fatal("interrupt did not end the wait")
	}
	if err := w.wait(time.Hour); err != nil { // returns at once after an interrupt
		t.Fatal(err)
	}
}
