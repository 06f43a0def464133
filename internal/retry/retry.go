// Package retry spaces the attempts of a client that retries (the OTLP exporter, the
// Kubernetes pod watch): a jittered exponential backoff, and a wait that ends with its
// context.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is the wait before retry number attempt (from 0): exponential from initial
// up to limit, jittered down by up to half so that agents cut off by the same outage
// do not all retry in lockstep when it ends.
func Backoff(initial, limit time.Duration, attempt int) time.Duration {
	d := limit
	if attempt < 32 {
		if e := initial << attempt; e > 0 && e < limit {
			d = e
		}
	}
	half := d / 2
	return half + rand.N(half+1)
}

// Sleep waits d, or until ctx ends; it reports whether it waited all of d.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
