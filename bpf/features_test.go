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

// Features goes on past a missing feature and tells a refused probe from a missing one.
func TestFeaturesReportsEach(t *testing.T) {
	got := featureStatuses([]feature{
		{"bpf_task_pt_regs", "5.15", func() error { return nil }},
		{"bpf_loop", "5.17", func() error { return ebpf.ErrNotSupported }},
		{"ring buffers", "5.8", func() error { return fmt.Errorf("probe: %w", os.ErrPermission) }},
		{"later", "9.9", func() error { return nil }},
	})
	if len(got) != 5 || !strings.HasPrefix(got[0].Name, "kernel BTF") {
		t.Fatalf("statuses %+v: want BTF and the four features", got)
	}
	if !got[1].Available() || got[1].Name != "bpf_task_pt_regs" || got[1].Since != "5.15" {
		t.Errorf("available feature: %+v", got[1])
	}
	if got[2].Available() || !errors.Is(got[2].Err, ErrNoBPF) {
		t.Errorf("missing feature: %+v", got[2])
	}
	if !errors.Is(got[3].Err, ErrPermission) || errors.Is(got[3].Err, ErrNoBPF) {
		t.Errorf("refused probe: %+v", got[3])
	}
	if !got[4].Available() {
		t.Errorf("a feature after a missing one was not probed: %+v", got[4])
	}
}

// As root, this kernel has every feature Features lists.
func TestFeaturesOfThisKernelEach(t *testing.T) {
	testenv.RequireRoot(t)
	for _, f := range Features() {
		if !f.Available() {
			t.Errorf("%s (Linux %s): %v", f.Name, f.Since, f.Err)
		}
	}
}
