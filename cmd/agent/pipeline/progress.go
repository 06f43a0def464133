package pipeline

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// Stderr is where sonde logs. A progress line may stand on the terminal's last line;
// anything else written clears it first, and the next redraw puts it back below.
var Stderr = &statusWriter{w: os.Stderr}

// statusWriter is a writer with a one-line status kept at its end on a terminal.
type statusWriter struct {
	mu    sync.Mutex
	w     io.Writer
	shown bool
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clearLocked()
	return s.w.Write(b)
}

// show replaces the status line: back to the line's start, the text, erase what an
// older, longer line left. The text must fit the terminal's width, or it wraps and the
// next carriage return no longer reaches its start.
func (s *statusWriter) show(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	io.WriteString(s.w, "\r"+line+"\x1b[K")
	s.shown = true
}

// clear erases the status line, before the final output.
func (s *statusWriter) clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clearLocked()
}

func (s *statusWriter) clearLocked() {
	if s.shown {
		io.WriteString(s.w, "\r\x1b[K")
		s.shown = false
	}
}

// progressEvery is how often the progress line is redrawn: often enough to look alive,
// rarely enough to cost nothing and not to flicker.
const progressEvery = 250 * time.Millisecond

// progress is what the progress line shows.
type progress struct {
	elapsed, duration time.Duration
	samples           uint64
	processes         int
	lost              uint64
}

// line formats the progress to fit width columns (0: no limit).
func (p progress) line(width int) string {
	var b strings.Builder
	b.WriteString("sonde: ")
	b.WriteString(p.elapsed.Truncate(100 * time.Millisecond).String())
	if p.duration > 0 {
		b.WriteString(" / " + p.duration.String())
	}
	fmt.Fprintf(&b, "  %d samples  %d processes", p.samples, p.processes)
	fmt.Fprintf(&b, "  %d lost", p.lost)
	s := b.String()
	if width > 0 && len(s) > width {
		s = s[:width] // ASCII only: a byte is a column
	}
	return s
}

// showProgress redraws a progress line on stderr while sonde samples, when stderr is a
// terminal and no live view owns it; stop clears it, before the final output.
func (p *Pipeline) showProgress() (stop func()) {
	fd := int(os.Stderr.Fd())
	if p.quiet || !term.IsTerminal(fd) {
		return func() {}
	}
	start := time.Now()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(progressEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			pr := progress{elapsed: time.Since(start), duration: p.cfg.Duration, samples: p.agg.Stats().Samples, processes: p.procs.Stats().Processes}
			if c, err := p.sampler.Counters(); err == nil {
				pr.lost = c.RingBufferFull
			}
			width, _, err := term.GetSize(fd)
			if err != nil {
				width = 80
			}
			// One column spare: a line filling the last column leaves some terminals'
			// cursor past the edge, and the next \r then returns on the line below.
			Stderr.show(pr.line(width - 1))
		}
	}()
	return func() {
		close(done)
		<-finished
		Stderr.clear()
	}
}
