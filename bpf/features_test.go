package bpf

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// A kernel without a helper is told which helper and which release has it.
func TestMissingFeatureIsNamed(t *testing.T) {
	ok := func() error { return nil }
	missing := func() error { return ebpf.ErrNotSupported }
	err := checkFeatures([]feature{
		{"bpf_task_pt_regs", "5.15", ok},
		{"bpf_loop", "5.17", missing},
		{"later", "9.9", missing},
	})
	if !errors.Is(err, ErrNoBPF) {
		t.Fatalf("error %v does not wrap ErrNoBPF", err)
	}
	if !errors.Is(err, ebpf.ErrNotSupported) {
		t.Errorf("error %v does not keep the probe's error", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "bpf_loop (Linux 5.17 or later)") || strings.Contains(msg, "later (Linux 9.9") {
		t.Errorf("error %q should name bpf_loop and Linux 5.17, and only the first missing feature", msg)
	}
	denied := func() error { return fmt.Errorf("probe: %w", os.ErrPermission) }
	if err := checkFeatures([]feature{{"bpf_loop", "5.17", denied}}); !errors.Is(err, ErrPermission) || errors.Is(err, ErrNoBPF) {
		t.Errorf("a probe refused for privileges gave %v, want ErrPermission and not ErrNoBPF", err)
	}
}

// This kernel has everything: the probes themselves work.
func TestFeaturesOfThisKernel(t *testing.T) {
	testenv.RequireRoot(t)
	if err := CheckFeatures(); err != nil {
		t.Fatalf("feature probes on this kernel: %v", err)
	}
}
