package main

import (
	"errors"
	"io"
	"slices"
	"testing"
)

func errAs[T any](err error, target *T) bool { return errors.As(err, target) }

func TestParseConfigDefaults(t *testing.T) {
	c, err := parseConfig(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.frequency != 19 || !c.kernelStacks || c.duration != 0 || c.top != 15 || len(c.pids) != 0 {
		t.Errorf("host-wide defaults: %+v", c)
	}
	c, err = parseConfig([]string{"--pid", "1,2", "-duration", "5s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.frequency != 199 || !slices.Equal(c.pids, []uint32{1, 2}) || c.duration.Seconds() != 5 {
		t.Errorf("--pid defaults: %+v", c)
	}
	c, err = parseConfig([]string{"--pid", "1", "--frequency", "49", "--kernel-stacks=false", "--output", "x.pprof"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.frequency != 49 || c.kernelStacks {
		t.Errorf("explicit flags lost: %+v", c)
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--frequency", "0"}, {"--frequency", "100000000"}, {"--pid", "0"}, {"--pid", "1,,2"},
		{"--duration", "-1s"}, {"--log-level", "loud"}, {"--output", "p.json"}, {"--top", "-1"}, {"stray"},
	} {
		_, err := parseConfig(args, io.Discard)
		var uerr usageError
		if !errors.As(err, &uerr) {
			t.Errorf("parseConfig(%v) = %v, want a usage error", args, err)
		}
	}
}
