package bpf

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
)

// Sentinel errors for what the host lacks. cmd/agent turns each into one sentence for the user.
var (
	// ErrPermission: the process may not load BPF programs or open perf events.
	ErrPermission = errors.New("not permitted to load BPF programs or open perf events")
	// ErrNoBPF: the kernel lacks a BPF feature sonde needs.
	ErrNoBPF = errors.New("kernel lacks a BPF feature sonde needs")
)

// classify wraps err with the sentinel that explains it, keeping the original for detail.
func classify(what string, err error) error {
	switch {
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%s: %w: %w", what, ErrPermission, err)
	case errors.Is(err, ebpf.ErrNotSupported):
		return fmt.Errorf("%s: %w: %w", what, ErrNoBPF, err)
	default:
		return fmt.Errorf("%s: %w", what, err)
	}
}
