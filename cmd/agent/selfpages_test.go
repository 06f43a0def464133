package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// Releasing the executable's read-only pages covers its code and lets the process go on:
// what runs next faults its pages back in from the file.
func TestReleaseOwnCode(t *testing.T) {
	n, err := releaseOwnCode()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Stat("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if n <= 0 || n > exe.Size()+1<<20 {
		t.Fatalf("released %d bytes of a %d-byte executable", n, exe.Size())
	}
	// Code and read-only data in use again: formatting and parsing touch both.
	if got := strings.Repeat(strconv.Itoa(42), 2); got != "4242" {
		t.Fatalf("after the release: %q", got)
	}
}
