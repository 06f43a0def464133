package pipeline

import "testing"

func TestProcsFor(t *testing.T) {
	for _, c := range []struct {
		frequency, cpus, offCPUWalks, avail, want int
	}{
		{20, 2, 0, 2, 1},      // the side-by-side storm
		{19, 64, 0, 64, 1},    // a large node at the default rate
		{999, 2, 0, 2, 1},     // a quick look at a high rate
		{999, 64, 0, 64, 16},  // 64 000 samples a second
		{999, 64, 0, 8, 8},    // no more than the container allows
		{19, 2, 1000, 2, 1},   // off-CPU, its walks bounded
		{19, 16, 1000, 16, 5}, // 16 304 events a second
		{19, 2, -1, 2, 2},     // off-CPU, every switch-out walked
		{0, 0, 0, 4, 1},       // nothing to go by
	} {
		if got := procsFor(c.frequency, c.cpus, c.offCPUWalks, c.avail); got != c.want {
			t.Errorf("procsFor(%d Hz, %d CPUs, %d walks, %d available) = %d, want %d", c.frequency, c.cpus, c.offCPUWalks, c.avail, got, c.want)
		}
	}
}
