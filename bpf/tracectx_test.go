package bpf

import (
	"bufio"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
	"github.com/sonde-profiler/sonde/tracectx"
)

// startReady starts a program that prints "ready" once it has set itself up.
func startReady(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "ready" {
		t.Fatalf("%s did not say ready", cmd.Path)
	}
	go func() {
		for sc.Scan() {
		}
	}()
}

// The kernel reads a goroutine's labels in both layouts Go has had: a map before 1.24,
// a slice since; the offsets come from the program, as the agent finds them.
func TestGoLabelsLayouts(t *testing.T) {
	testenv.RequireRoot(t)
	for _, toolchain := range []string{"local", "go1.23.4"} {
		t.Run(toolchain, func(t *testing.T) {
			bin := testprog.BuildGoLabels(t, toolchain)
			f, err := os.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			ef, err := elf.NewFile(f)
			if err != nil {
				t.Fatal(err)
			}
			rt, err := tracectx.ReadGoRuntime(ef, f)
			if err != nil {
				t.Fatal(err)
			}
			if want := toolchain == "local"; rt.SliceLabels != want {
				t.Fatalf("%s: slice labels %v, want %v", rt.Version, rt.SliceLabels, want)
			}
			prog := exec.Command(bin, "120s")
			startReady(t, prog)
			pid := uint32(prog.Process.Pid)
			s, err := Load(Config{PIDs: []uint32{pid}, Frequency: 199})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			layout := GoLabelsMap
			if rt.SliceLabels {
				layout = GoLabelsSlice
			}
			if err := s.SetTraceContext(pid, TraceContextProc{GoLayout: layout, GoGOffset: rt.GOffset, GoGM: rt.GM, GoMCurg: rt.MCurg, GoGLabels: rt.GLabels}); err != nil {
				t.Fatal(err)
			}
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			rec := &contextRecorder{}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx, rec) }()
			// 200 samples: a share of 0.9 is then known to within ±0.04.
			waitSamples(t, s, 200)
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if rec.samples < 200 {
				t.Fatalf("%d samples read, where the kernel counted at least 200", rec.samples)
			}
			// Nearly all the time is spent in burn, inside pprof.Do.
			if share := float64(rec.labelled) / float64(rec.samples); share < 0.9 {
				t.Errorf("%d of %d samples carry the labels (%.2f); bad ones: %v", rec.labelled, rec.samples, share, rec.bad)
			}
			c, err := s.Counters()
			if err != nil {
				t.Fatal(err)
			}
			if c.Context.GoLabels < uint64(rec.labelled) || c.Context.Torn+c.Context.GoTruncated > 0 {
				t.Errorf("kernel counters %+v for %d labelled samples", c.Context, rec.labelled)
			}
			t.Logf("%s: %d of %d samples labelled; %+v", rt.Version, rec.labelled, rec.samples, c.Context)
		})
	}
}

type contextRecorder struct {
	samples, labelled int
	bad               []string
}

func (r *contextRecorder) HandleSample(s *Sample) {
	r.samples++
	if s.ContextSource != ContextGoLabels {
		return
	}
	labels, err := tracectx.ParseGoLabels(s.Context)
	link, rest := tracectx.GoLink(labels)
	if err == nil && !link.IsZero() && len(rest) == 1 && rest[0] == (tracectx.Attribute{Key: "route", Value: "/work"}) {
		r.labelled++
	} else if len(r.bad) < 3 {
		r.bad = append(r.bad, strings.TrimSpace(string(s.Context)))
	}
}

func (r *contextRecorder) HandleProcessEvent(ProcessEvent) {}
