package interp

import (
	"testing"
	"time"
)

// TestCodesRetryFailed: a failed read is tried again once Retry has passed, when the code is
// named or seen again, and not before; a read that succeeded is not read again until
// Recheck.
func TestCodesRetryFailed(t *testing.T) {
	now := time.Unix(1000, 0)
	reads, fail := 0, true
	c := NewCodes(CodesConfig[string]{
		MaxCodes: 16, MaxPending: 16, Recheck: time.Hour, Retry: time.Second,
		Read: func(uint32, CodeKey, bool) (string, bool) {
			reads++
			if fail {
				return "", false
			}
			return "named", false
		},
		Failed: func(s string) bool { return s == "" },
		Same:   func(uint32, CodeKey, string) (bool, bool) { return true, true },
		Now:    func() time.Time { return now },
	})
	k := CodeKey{Image: 1, Code: 0x40}
	if v, _ := c.Get(7, k); v != "" || reads != 1 {
		t.Fatalf("first read: %q after %d reads", v, reads)
	}
	fail = false
	now = now.Add(500 * time.Millisecond)
	if v, known := c.Get(7, k); v != "" || !known || reads != 1 {
		t.Fatalf("before Retry: %q known %v after %d reads, want the failure kept", v, known, reads)
	}
	now = now.Add(time.Second)
	if v, _ := c.Get(7, k); v != "named" || reads != 2 {
		t.Fatalf("after Retry: %q after %d reads", v, reads)
	}
	now = now.Add(time.Minute)
	if v, known := c.Get(7, k); v != "named" || !known || reads != 2 {
		t.Fatalf("named: %q known %v after %d reads, want no read before Recheck", v, known, reads)
	}
	if st := c.Stats(); st.Retries != 1 {
		t.Errorf("stats %+v, want 1 retry", st)
	}

	// Seen queues a failed code's retry for the reader.
	fail = true
	k2 := CodeKey{Image: 1, Code: 0x80}
	c.Get(7, k2)
	fail = false
	now = now.Add(2 * time.Second)
	c.Seen(7, k2)
	if c.Pending() != 1 {
		t.Fatalf("%d pending after a failed code was seen past Retry, want 1", c.Pending())
	}
}
