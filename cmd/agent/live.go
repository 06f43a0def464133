package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/term"

	"github.com/sonde-profiler/sonde/cmd/agent/pipeline"
	"github.com/sonde-profiler/sonde/internal/procfs"
	"github.com/sonde-profiler/sonde/reporter/top"
	"github.com/sonde-profiler/sonde/trace"
)

const topAbout = `A live view of the functions on the CPU, host-wide, of --pid processes or of a --cgroup,
over a sliding window of the last seconds, redrawn every second, as perf top shows them.

Keys: s rank by self samples, c by cumulative, p or space pause (counting goes on),
q or Ctrl-C quit.`

// topHostFrequency is sonde top's host-wide rate: a second's redraw needs more samples
// than the agent's cheap 19 Hz gives.
const topHostFrequency = 99

// topMain is `sonde top`.
func topMain(args []string) int {
	s, err := newSubcommand("top", "sonde top [flags]", topAbout, os.Getenv, stderr)
	if err != nil {
		return usageStatus("top", err, stderr)
	}
	window := s.fs.Duration("window", 10*time.Second, "rank the samples of the last `D` (at least 1s)")
	sortBy := s.fs.String("sort", "self", "rank functions by `self` or cum (cumulative) samples; the keys s and c switch")
	cgroupArg := s.fs.String("cgroup", "", "show only processes in cgroup v2 `PATH` and below: a directory of a cgroup2 mount, or the path /proc/PID/cgroup names (0::PATH); the filter is in sonde, so sampling costs what host-wide sampling does")
	s.share("pid", "", "")
	s.share("frequency", "", fmt.Sprintf("samples per second per CPU (`HZ`, at most %d) (default %d host-wide, %d with --pid)", maxFrequency, topHostFrequency, targetFrequency))
	s.share("duration", "", "stop after this long (0: until q, Ctrl-C, SIGINT or SIGTERM)")
	// Symbol tables name functions at once; DWARF's lines and inlined functions take
	// seconds to load for a large library, too long for a view that is to show at once.
	s.share("symbolize", "symtab", "")
	for _, name := range []string{"kernel-stacks", "unwind", "memory-limit"} {
		s.share(name, "", "")
	}
	s.share("log-level", "warn", "log `level` (debug, info, warn or error); logs are shown when the view ends")
	c, err := s.parse(args)
	if err != nil {
		return usageStatus("top", err, stderr)
	}
	switch {
	case s.fs.NArg() > 0:
		err = fmt.Errorf("unexpected argument %q", s.fs.Arg(0))
	case *window < time.Second:
		err = fmt.Errorf("--window %v: must be at least 1s", *window)
	case *sortBy != "self" && *sortBy != "cum":
		err = fmt.Errorf("--sort %q: want self or cum", *sortBy)
	}
	var filter *cgroupFilter
	if *cgroupArg != "" && err == nil {
		var path string
		if path, err = cgroupPath(*cgroupArg); err != nil {
			err = fmt.Errorf("--cgroup %s: %w", *cgroupArg, err)
		}
		filter = &cgroupFilter{path: path, procFS: "/proc"}
	}
	if err == nil && !term.IsTerminal(int(os.Stdout.Fd())) {
		err = errors.New("the live view needs a terminal on standard output; for a table of a run, use sonde --duration D")
	}
	if err != nil {
		return usageStatus("top", usageError{err}, stderr)
	}
	if !s.given("frequency") && len(c.PIDs) == 0 {
		c.Frequency = topHostFrequency
		if err := checkFrequency(c.Frequency); err != nil {
			return usageStatus("top", usageError{err}, stderr)
		}
	}
	c.Interval, c.Top, c.Outputs = time.Second, 0, nil

	// Logs would scribble over the view: they are kept, the last of them, and shown after.
	logs := &tailBuffer{max: 64 << 10}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: c.LogLevel}))
	defer func() { os.Stderr.Write(logs.Bytes()) }()

	scope := "host-wide"
	switch {
	case len(c.PIDs) > 0 && filter != nil:
		scope = fmt.Sprintf("pid %s in cgroup %s", pidList(c.PIDs), filter.path)
	case len(c.PIDs) > 0:
		scope = "pid " + pidList(c.PIDs)
	case filter != nil:
		scope = "cgroup " + filter.path
	}
	v := &liveView{
		out:     bufio.NewWriterSize(os.Stdout, 64<<10),
		fd:      int(os.Stdout.Fd()),
		window:  top.NewWindow(*window),
		sortCum: *sortBy == "cum",
		filter:  filter,
		waiting: true,
		title:   fmt.Sprintf("sonde top: %s, %d Hz, last %v", printable(scope), c.Frequency, *window),
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, quit := context.WithCancel(ctx)
	defer quit()

	p, err := pipeline.Build(c, log)
	if err != nil {
		fmt.Fprintf(stderr, "sonde top: %s\n", printable(explain(err)))
		if isUsage(err) {
			return 2
		}
		return 1
	}
	defer p.Close()
	p.Quiet()
	p.AddSink(v)
	v.lost = p.LostSamples

	restore, err := v.enter()
	if err != nil {
		fmt.Fprintf(stderr, "sonde top: %v\n", err)
		return 1
	}
	defer restore()
	go v.readKeys(quit, restore)
	go v.followResizes(ctx, restore)
	v.draw()
	began := time.Now()
	if err := p.Run(ctx); err != nil {
		restore()
		fmt.Fprintf(stderr, "sonde top: %s\n", printable(explain(err)))
		return 1
	}
	// Neither a key, a signal nor --duration: the view closes because its targets did.
	if ctx.Err() == nil && len(c.PIDs) > 0 && (c.Duration == 0 || time.Since(began) < c.Duration) {
		restore()
		fmt.Fprintln(stderr, "sonde top: every --pid process exited")
	}
	return 0
}

// liveView is sonde top's screen: a sink that ranks each interval's functions in a
// sliding window and redraws.
type liveView struct {
	out   *bufio.Writer
	fd    int
	title string
	lost  func() uint64

	mu      sync.Mutex
	window  *top.Window
	filter  *cgroupFilter
	sortCum bool
	paused  *top.Table // what a paused screen shows
	waiting bool       // no interval yet
	size    [2]int     // columns, rows of the last draw
}

func (v *liveView) Add(p *trace.Profile) {
	v.mu.Lock()
	if v.filter != nil {
		p = v.filter.apply(p)
	}
	v.window.Add(p)
	v.waiting = false
	v.mu.Unlock()
	v.draw()
}

func (v *liveView) Close(context.Context) error { return nil }

// enter puts the terminal in raw mode (keys arrive one by one, Ctrl-C among them) and on
// the alternate screen, cursor hidden; restore undoes it all, once, however often called.
func (v *liveView) enter() (restore func(), err error) {
	in := int(os.Stdin.Fd())
	var state *term.State
	if term.IsTerminal(in) {
		if state, err = term.MakeRaw(in); err != nil {
			return nil, fmt.Errorf("raw terminal: %w", err)
		}
	}
	io.WriteString(os.Stdout, "\x1b[?1049h\x1b[?25l")
	var once sync.Once
	restore = func() {
		once.Do(func() {
			v.mu.Lock()
			defer v.mu.Unlock()
			v.out.Flush()
			io.WriteString(os.Stdout, "\x1b[?25h\x1b[?1049l")
			if state != nil {
				term.Restore(in, state)
			}
		})
	}
	return restore, nil
}

// readKeys acts on keys until q or Ctrl-C; a panic restores the terminal first.
func (v *liveView) readKeys(quit func(), restore func()) {
	defer func() {
		if r := recover(); r != nil {
			restore()
			panic(r)
		}
	}()
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		return
	}
	buf := make([]byte, 64)
	for {
		n, err := os.Stdin.Read(buf)
		for _, k := range buf[:n] {
			switch k {
			case 'q', 'Q', 0x03, 0x04: // Ctrl-C, Ctrl-D
				quit()
				return
			default:
				if v.key(k) {
					v.draw()
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// key applies a key to the view's state and reports whether it changed.
func (v *liveView) key(k byte) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch k {
	case 's', 'S':
		v.sortCum = false
	case 'c', 'C':
		v.sortCum = true
	case 'p', 'P', ' ':
		if v.paused == nil {
			v.paused = v.window.Table()
		} else {
			v.paused = nil
		}
	default:
		return false
	}
	return true
}

// followResizes redraws at the terminal's new size.
func (v *liveView) followResizes(ctx context.Context, restore func()) {
	defer func() {
		if r := recover(); r != nil {
			restore()
			panic(r)
		}
	}()
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-winch:
			v.draw()
		}
	}
}

// draw redraws the whole screen in place: home, each line erased to its end, the rest
// of the screen erased; one write, so the terminal never shows half a frame.
func (v *liveView) draw() {
	v.mu.Lock()
	defer v.mu.Unlock()
	cols, rows, err := term.GetSize(v.fd)
	if err != nil || cols < 20 || rows < 5 {
		cols, rows = max(cols, 80), max(rows, 24)
	}
	table, state := v.window.Table(), ""
	if v.paused != nil {
		table, state = v.paused, "  [paused]"
	}
	sortName := "self"
	rowsOf, total := table.Rows()
	if v.sortCum {
		top.SortByCum(rowsOf)
		sortName = "cumulative"
	}
	lines := []string{
		fitColumns(v.title+", by "+sortName+state, cols),
		fitColumns(fmt.Sprintf("%s, %d lost  %s", table.Summary(), v.lostSamples(), time.Now().Format("15:04:05")), cols),
		"",
		fitColumns(top.Header, cols),
	}
	room := rows - len(lines) - 1 // the last row holds the keys
	switch {
	case v.waiting:
		lines = append(lines, "  waiting for the first second of samples...")
	case total == 0:
		lines = append(lines, "  no samples: nothing ran on a CPU")
	default:
		lines = append(lines, top.Lines(rowsOf[:min(room, len(rowsOf))], total, cols)...)
	}
	var b strings.Builder
	b.WriteString("\x1b[H")
	for i, l := range lines[:min(len(lines), rows-1)] {
		if i > 0 {
			b.WriteString("\r\n")
		}
		b.WriteString(l)
		b.WriteString("\x1b[K")
	}
	// The keys on the last row, whatever the table's length.
	fmt.Fprintf(&b, "\x1b[%d;1H%s\x1b[K", rows, fitColumns("s self  c cumulative  p pause  q quit", cols))
	b.WriteString("\x1b[J")
	if v.size != [2]int{cols, rows} {
		// After a resize the terminal may have moved old text anywhere: start clean.
		v.size = [2]int{cols, rows}
		v.out.WriteString("\x1b[2J")
	}
	v.out.WriteString(b.String())
	v.out.Flush()
}

func (v *liveView) lostSamples() uint64 {
	if v.lost == nil {
		return 0
	}
	return v.lost()
}

// fitColumns cuts s to n columns, a rune to a column.
func fitColumns(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:max(n, 0)])
}

func pidList(pids []uint32) string {
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = strconv.FormatUint(uint64(p), 10)
	}
	return strings.Join(s, ",")
}

// cgroupFilter keeps the samples of processes in a cgroup v2 subtree. A process's cgroup
// is read once and remembered for a while: processes seldom move, and a live view
// cannot afford a /proc read per sample.
type cgroupFilter struct {
	path   string // in the hierarchy, as /proc/PID/cgroup names it: "/", "/system.slice/x.service"
	procFS string
	in     map[uint32]bool
	since  time.Time
}

// cgroupMemory is how long a process's cgroup is trusted: a process moved into the
// cgroup shows up within it, a PID reused by another process is read afresh.
const cgroupMemory = 10 * time.Second

func (f *cgroupFilter) apply(p *trace.Profile) *trace.Profile {
	if f.in == nil || time.Since(f.since) > cgroupMemory {
		f.in, f.since = map[uint32]bool{}, time.Now()
	}
	out := &trace.Profile{Start: p.Start, End: p.End, Period: p.Period}
	for _, s := range p.Samples {
		if s.Process == nil {
			continue
		}
		in, ok := f.in[s.Process.PID]
		if !ok {
			in = f.contains(s.Process.PID)
			f.in[s.Process.PID] = in
		}
		if in {
			out.Samples = append(out.Samples, s)
		}
	}
	return out
}

// contains reports whether pid is in the cgroup or below it; a process that exited is not.
func (f *cgroupFilter) contains(pid uint32) bool {
	b, err := os.ReadFile(filepath.Join(f.procFS, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return false
	}
	for line := range bytes.Lines(b) {
		if cg, ok := bytes.CutPrefix(bytes.TrimRight(line, "\n"), []byte("0::")); ok {
			return under(string(cg), f.path)
		}
	}
	return false
}

// under reports whether cgroup path cg is dir or below it.
func under(cg, dir string) bool {
	return dir == "/" || cg == dir || strings.HasPrefix(cg, dir+"/")
}

// cgroupPath turns --cgroup into a path in the cgroup v2 hierarchy: a directory in a
// cgroup2 mount (mounted at /sys/fs/cgroup, or /sys/fs/cgroup/unified beside v1), or
// such a path already, which must exist.
func cgroupPath(arg string) (string, error) {
	mounts, err := cgroup2Mounts("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	if len(mounts) == 0 {
		return "", errors.New("no cgroup v2 file system is mounted")
	}
	clean := filepath.Clean(arg)
	for _, m := range mounts {
		if rel, err := filepath.Rel(m.dir, clean); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			if st, err := os.Stat(clean); err != nil || !st.IsDir() {
				return "", errors.New("no such cgroup directory")
			}
			return filepath.Join(m.root, rel), nil
		}
	}
	for _, m := range mounts {
		if rel, err := filepath.Rel(m.root, clean); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			if st, err := os.Stat(filepath.Join(m.dir, rel)); err == nil && st.IsDir() {
				return clean, nil
			}
		}
	}
	return "", errors.New("no such cgroup: name a directory of a cgroup2 mount or a path as /proc/PID/cgroup writes it")
}

type cgroup2Mount struct{ root, dir string }

// cgroup2Mounts lists the cgroup2 mounts: where each is mounted, and which directory of
// the hierarchy it shows there (not "/" in a container that sees its own subtree).
func cgroup2Mounts(mountinfo string) ([]cgroup2Mount, error) {
	mounts, err := procfs.Mounts(mountinfo)
	if err != nil {
		return nil, err
	}
	var out []cgroup2Mount
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			out = append(out, cgroup2Mount{root: m.Root, dir: m.Dir})
		}
	}
	return out, nil
}

// tailBuffer keeps the last max bytes written to it, whole lines.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - t.max; over > 0 {
		cut := over
		if i := bytes.IndexByte(t.buf[over:], '\n'); i >= 0 {
			cut = over + i + 1
		}
		t.buf = append(t.buf[:0], t.buf[cut:]...)
	}
	return len(b), nil
}

func (t *tailBuffer) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return bytes.Clone(t.buf)
}
