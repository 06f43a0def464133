package pipeline

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/internal/testenv"
)

// Once Build has registered the runtimes, the sampler holds no BTF of its program (0.4 MB
// of heap for the life of the agent): a runtime registered later is refused.
func TestBuildSealsRuntimes(t *testing.T) {
	testenv.RequireRoot(t)
	for _, unwind := range []string{"tables", "fp"} {
		t.Run(unwind, func(t *testing.T) {
			cfg := &Config{PIDs: []uint32{uint32(os.Getpid())}, Frequency: 19, Interval: time.Second, Unwind: unwind}
			p, err := Build(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatalf("build: %v", err)
			}
			defer p.Close()
			if unwind == "tables" && len(p.runtimes) != len(runtimeSpecs) {
				t.Errorf("%d runtimes registered, want %d", len(p.runtimes), len(runtimeSpecs))
			}
			spec := runtimeSpecs[0]
			if _, err := p.sampler.Runtime(mapsOf(spec), spec.State); !errors.Is(err, bpf.ErrRuntimesSealed) {
				t.Errorf("a runtime registered after Build: %v, want %v", err, bpf.ErrRuntimesSealed)
			}
		})
	}
}
