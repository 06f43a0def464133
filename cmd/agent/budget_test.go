package main

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The resident set read from statm kept open follows the process's memory as a fresh
// read of the file does: a read at offset 0 produces the file again.
func TestResidentReaderFollowsMemory(t *testing.T) {
	var r residentReader
	defer r.close()
	first := r.bytes()
	if first <= 0 {
		t.Fatalf("resident set %d bytes", first)
	}
	// 64 MB touched page by page is resident until it goes.
	mem := make([]byte, 64<<20)
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	grown := r.bytes()
	if grown < first+48<<20 {
		t.Errorf("resident set %d bytes after touching 64 MB, %d before", grown, first)
	}
	if fresh := residentBytes(); fresh < grown-8<<20 || fresh > grown+8<<20 {
		t.Errorf("kept open: %d bytes; read afresh: %d", grown, fresh)
	}
	mem[len(mem)-1] = 2
}

func TestStatmResident(t *testing.T) {
	for in, want := range map[string]int64{
		"2000 300 100 50 0 900 0\n": 300 * 4096,
		"2000":                      0,
		"":                          0,
		"2000 x 1":                  0,
	} {
		if got := statmResident([]byte(in)); got != want {
			t.Errorf("statm %q: %d, want %d", in, got, want)
		}
	}
}

// Over the budget, each check sheds the next cache, least valuable first, and the
// watches that share the ticker run at every check.
func TestPressureShedsInOrderAndRunsTheOtherWatches(t *testing.T) {
	var mu sync.Mutex
	var order []int
	var checks atomic.Int64
	p := &pressure{limit: 1, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for i := range 3 {
		p.sheds = append(p.sheds, func() { mu.Lock(); order = append(order, i); mu.Unlock() })
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.run(ctx, 5*time.Millisecond, func() { checks.Add(1) }); close(done) }()
	deadline := time.Now().Add(time.Minute)
	for p.shed.Load() < 3 || checks.Load() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: %d sheds, %d checks", p.shed.Load(), checks.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 3 || order[0] != 0 || order[1] != 1 || order[2] != 2 {
		t.Errorf("shed in order %v, want [0 1 2], each once", order)
	}
	if p.peakRSS.Load() <= 0 {
		t.Errorf("peak resident set %d", p.peakRSS.Load())
	}
}
