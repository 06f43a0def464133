package pipeline

import (
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/procfs"
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

// The high-water mark is at least what is resident now.
func TestHighWaterBytes(t *testing.T) {
	var r residentReader
	defer r.close()
	now, peak := r.bytes(), highWaterBytes()
	if now <= 0 || peak < now {
		t.Errorf("resident %d bytes, high-water mark %d", now, peak)
	}
}

func TestStatmResident(t *testing.T) {
	for in, want := range map[string]int64{
		"2000 300 100 50 0 900 0\n": 300 * 4096,
		"2000":                      0,
		"":                          0,
		"2000 x 1":                  0,
	} {
		if got := procfs.StatmResident([]byte(in)); got != want {
			t.Errorf("statm %q: %d, want %d", in, got, want)
		}
	}
}

// Over the budget, each check sheds the next cache, least valuable first; under it, the
// order starts again.
func TestPressureShedsInOrder(t *testing.T) {
	var order []int
	p := &pressure{limit: 1, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	defer p.statm.close()
	for i := range 3 {
		p.sheds = append(p.sheds, func() { order = append(order, i) })
	}
	for range 5 {
		p.check()
	}
	if !slices.Equal(order, []int{0, 1, 2}) || p.shed.Load() != 3 {
		t.Errorf("shed %v (%d counted), want [0 1 2], each once", order, p.shed.Load())
	}
	if p.peakRSS.Load() <= 0 {
		t.Errorf("peak resident set %d", p.peakRSS.Load())
	}
	p.limit = 1 << 50
	p.check()
	p.limit = 1
	p.check()
	if !slices.Equal(order, []int{0, 1, 2, 0}) {
		t.Errorf("shed %v after the resident set went under the budget and over again, want [0 1 2 0]", order)
	}
}

// The checks ride on the ring reader's polls, which come every 50 ms to 1 s: they run
// about once a second, whatever the polls' rate.
func TestPolledChecksAboutOnceASecond(t *testing.T) {
	checks := 0
	p := &Pipeline{pressure: &pressure{limit: 1, log: slog.New(slog.NewTextHandler(io.Discard, nil))}, ringWatch: ringWatch{done: true}}
	for range 10 {
		p.pressure.sheds = append(p.pressure.sheds, func() { checks++ })
	}
	defer p.pressure.statm.close()
	now := time.Unix(1_000_000, 0)
	for range 60 { // three seconds of polls every 50 ms
		p.Polled(now)
		now = now.Add(50 * time.Millisecond)
	}
	if checks < 3 || checks > 4 { // every 0.9 s: a poll may come a little early
		t.Errorf("%d checks in 3 s of polls every 50 ms, want 3 or 4", checks)
	}
}
