package retry

import (
	"context"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	for attempt := range 40 {
		d := Backoff(time.Second, 30*time.Second, attempt)
		full := 30 * time.Second
		if attempt < 31 {
			full = min(time.Second<<attempt, full)
		}
		if d < full/2 || d > full {
			t.Errorf("attempt %d: %v outside [%v, %v]", attempt, d, full/2, full)
		}
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep of an hour on an ended context waited it all")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Error("Sleep of a millisecond did not wait it")
	}
}
