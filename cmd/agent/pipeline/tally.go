package pipeline

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/sonde-profiler/sonde/trace"
)

// tally counts, over a run, what its end tells a person on a terminal: the samples, the
// processes they came from, and the frames left unnamed by why. It is a sink: it sees each
// interval once named.
type tally struct {
	samples, frames, unnamed int64
	pids                     map[uint32]struct{}
	// why counts unnamed frames by reason, each reason a sentence's end.
	why map[string]int64
}

func newTally() *tally { return &tally{pids: map[uint32]struct{}{}, why: map[string]int64{}} }

func (t *tally) Add(p *trace.Profile) {
	for _, s := range p.Samples {
		t.samples += s.Count
		if s.Process != nil {
			t.pids[s.Process.PID] = struct{}{}
		}
		for _, l := range s.Locations {
			if l == nil {
				continue
			}
			t.frames += s.Count
			if len(l.Lines) > 0 {
				continue
			}
			t.unnamed += s.Count
			t.why[unnamedReason(l)] += s.Count
		}
	}
}

func (t *tally) Close(context.Context) error { return nil }

// unnamedReason says why a frame has no name, in words a person acts on.
func unnamedReason(l *trace.Location) string {
	switch {
	case l.Kind == trace.FrameKernel:
		return "in the kernel (no kallsyms: run as root)"
	case l.Kind == trace.FrameInterp:
		return "in a language runtime's code that could not be read (the process exited first, or a version sonde does not name)"
	case l.Mapping == nil || l.Mapping.Path == "" || l.Mapping.Path[0] == '[':
		return "outside any file (JIT code of a runtime sonde does not know, or mappings that changed)"
	default:
		name := filepath.Base(l.Mapping.Path)
		if name == "." || name == "/" || name == "" {
			name = "a file"
		}
		return fmt.Sprintf("in %s (no symbols: stripped, and no debug file here or from debuginfod)", name)
	}
}

// print writes the run's end for a person: a few lines after the table. Every counter
// stays in /metrics and in the log's summary at debug level.
func (t *tally) print(w io.Writer, span time.Duration, lost uint64) error {
	line := fmt.Sprintf("sonde: %s samples over %.1fs from %s, %s lost\n",
		thousands(t.samples), span.Seconds(), plural(len(t.pids), "process", "processes"), thousands(int64(lost)))
	if t.frames > 0 {
		share := 100 * float64(t.unnamed) / float64(t.frames)
		if t.unnamed == 0 {
			line += "       every frame named\n"
		} else {
			reasons := slices.SortedFunc(maps.Keys(t.why), func(a, b string) int {
				return cmp.Or(cmp.Compare(t.why[b], t.why[a]), cmp.Compare(a, b))
			})
			line += fmt.Sprintf("       %.1f%% of frames unnamed, most %s\n", share, reasons[0])
		}
	}
	line += "       every counter: /metrics, or --log-level debug\n"
	_, err := io.WriteString(w, line)
	return err
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return thousands(int64(n)) + " " + many
}

// thousands writes n with a space between groups of three digits, as the table does.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 || len(s) <= 3 {
		return s
	}
	var b []byte
	for i, c := range []byte(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			b = append(b, ' ')
		}
		b = append(b, c)
	}
	return string(b)
}
