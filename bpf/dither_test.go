package bpf

import (
	"math"
	"testing"
	"time"
)

// The redrawn periods spread between the rates of half and one and a half times the
// frequency, and two draws in a row sample at the frequency asked for, on average.
func TestDitherKeepsTheRate(t *testing.T) {
	s := &Sampler{frequency: 199}
	var lo, hi float64 = math.Inf(1), 0
	for range 1000 {
		a, b := s.nextPeriod(), s.nextPeriod()
		ra, rb := float64(time.Second)/float64(a), float64(time.Second)/float64(b)
		if mean := (ra + rb) / 2; math.Abs(mean-199) > 0.01 {
			t.Fatalf("two draws sample at %.3f Hz, want 199", mean)
		}
		lo, hi = min(lo, ra, rb), max(hi, ra, rb)
	}
	if lo < 99.4 || hi > 298.6 || hi-lo < 150 {
		t.Errorf("rates drawn between %.1f and %.1f Hz, want spread over 99.5..298.5", lo, hi)
	}
}

func TestDitherEvery(t *testing.T) {
	for _, c := range []struct {
		hz   int
		want time.Duration
	}{{19, 10 * time.Second / 19}, {199, 10 * time.Second / 199}, {999, 20 * time.Millisecond}, {0, 10 * time.Second}} {
		if got := ditherEvery(c.hz); got != c.want {
			t.Errorf("ditherEvery(%d) = %v, want %v", c.hz, got, c.want)
		}
	}
}

// A poll that comes before the redraw is due keeps the rate: the kernel wakes the reader
// early for a full ring or a new process, and each redraw interrupts every CPU.
func TestDitherWaitsItsTurn(t *testing.T) {
	s := &Sampler{frequency: 19}
	now := time.Unix(1000, 0)
	draws := 0
	for range 100 { // 20 s of wake-ups, 200 ms apart
		before := s.redrawAt
		s.ditherPeriod(now)
		if !s.redrawAt.Equal(before) {
			draws++
		}
		now = now.Add(200 * time.Millisecond)
	}
	// One draw every third wake-up: ten samples at 19 Hz are 526 ms.
	if draws < 30 || draws > 40 {
		t.Errorf("%d draws in 100 polls at 19 Hz, want one every third", draws)
	}
}

// The reader collects the ring at each redraw, at most a second apart.
func TestPollEvery(t *testing.T) {
	for _, c := range []struct {
		hz   int
		want time.Duration
	}{{19, 10 * time.Second / 19}, {199, 10 * time.Second / 199}, {5, time.Second}} {
		if got := pollEvery(c.hz); got != c.want {
			t.Errorf("pollEvery(%d) = %v, want %v", c.hz, got, c.want)
		}
	}
}
