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
	}{{19, pollInterval}, {199, 10 * time.Second / 199}, {999, 20 * time.Millisecond}, {0, pollInterval}} {
		if got := ditherEvery(c.hz); got != c.want {
			t.Errorf("ditherEvery(%d) = %v, want %v", c.hz, got, c.want)
		}
	}
}
