package folded

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/sonde-profiler/sonde/reporter/internal/frames"
	"github.com/sonde-profiler/sonde/trace"
)

// Options tune Write. The zero value is what flame graph tools expect.
type Options struct {
	// OmitProcess leaves out the root frame that names each stack's process. By
	// default every stack starts with "name-PID", as stackcollapse-perf.pl --pid writes,
	// so a host-wide profile splits into one tower per process and stacks from perf
	// and sonde line up.
	OmitProcess bool
}

// unknownFrame stands in for a frame without a name and for a sample without frames,
// as perf's tools write it: a folded line needs at least one frame.
const unknownFrame = "[unknown]"

// Write writes p as folded stacks with the default options.
func Write(w io.Writer, p *trace.Profile) error {
	return WriteOptions(w, p, Options{})
}

// WriteOptions writes one line per distinct stack: its frames root first, joined by
// ';', a location's inlined functions outermost first, then a space and the number of
// samples. Samples of different threads with the same stack share a line. Lines are
// sorted, so equal profiles give equal files.
//
// Names are made printable (see frames.Clean) and a ';' inside a name is written as
// \x3b, so every line is one valid UTF-8 stack whatever the names hold. Neither is
// undone by Read: the escapes stay part of the name.
func WriteOptions(w io.Writer, p *trace.Profile, opts Options) error {
	counts := make(map[string]int64)
	var stack []frames.Frame
	var line strings.Builder
	for _, s := range p.Samples {
		if s.Count <= 0 {
			continue
		}
		stack = frames.Stack(stack[:0], s, !opts.OmitProcess)
		line.Reset()
		for i, f := range stack {
			if i > 0 {
				line.WriteByte(';')
			}
			writeFrame(&line, f.Name)
		}
		if len(stack) == 0 {
			line.WriteString(unknownFrame)
		}
		key := line.String()
		n := counts[key]
		if n > math.MaxInt64-s.Count {
			return fmt.Errorf("write folded stacks: the count of %q overflows", key)
		}
		counts[key] = n + s.Count
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	bw := bufio.NewWriter(w)
	for _, k := range keys {
		bw.WriteString(k)
		bw.WriteByte(' ')
		bw.WriteString(strconv.FormatInt(counts[k], 10))
		bw.WriteByte('\n')
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write folded stacks: %w", err)
	}
	return nil
}

func writeFrame(b *strings.Builder, name string) {
	if name == "" {
		b.WriteString(unknownFrame)
		return
	}
	for {
		i := strings.IndexByte(name, ';')
		if i < 0 {
			b.WriteString(name)
			return
		}
		b.WriteString(name[:i])
		b.WriteString(`\x3b`)
		name = name[i+1:]
	}
}

// Limits on what Read accepts, so that a hostile or corrupt file fails instead of
// taking the memory of the host. A folded file holds each distinct stack once; a deep
// stack of long C++ names takes a few hundred KiB.
const (
	MaxLineBytes = 4 << 20
	MaxLines     = 4 << 20
)

// Read parses folded stacks into a profile. Each distinct frame name becomes one
// location with one line, named and nothing else; a root frame of the form "name-PID"
// (see Options.OmitProcess) becomes the sample's process. Lines with the same stack are
// summed. Empty lines are skipped; an empty frame becomes "[unknown]". The profile has
// no time span or period: folded stacks do not record them.
func Read(r io.Reader) (*trace.Profile, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	rd := reader{
		p:         &trace.Profile{},
		locations: make(map[string]*trace.Location),
		processes: make(map[pidName]*trace.Process),
		samples:   make(map[string]*trace.Sample),
	}
	var buf []byte
	for lineNo := 1; ; lineNo++ {
		line, err := readLine(br, buf[:0])
		buf = line
		if errors.Is(err, errLineTooLong) {
			return nil, fmt.Errorf("read folded stacks: line %d: longer than %d bytes", lineNo, MaxLineBytes)
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("read folded stacks: line %d: %w", lineNo, err)
		}
		if len(line) > 0 {
			if lineNo > MaxLines {
				return nil, fmt.Errorf("read folded stacks: more than %d lines", MaxLines)
			}
			if perr := rd.parse(string(line)); perr != nil {
				return nil, fmt.Errorf("read folded stacks: line %d: %w", lineNo, perr)
			}
		}
		if err != nil {
			return rd.p, nil
		}
	}
}

var errLineTooLong = errors.New("line too long")

// readLine appends the next line to buf without its line ending.
func readLine(br *bufio.Reader, buf []byte) ([]byte, error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if len(buf)+len(chunk) > MaxLineBytes+2 { // +2: the line ending
			return buf, errLineTooLong
		}
		buf = append(buf, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		buf = trimEOL(buf)
		if len(buf) > MaxLineBytes {
			return buf, errLineTooLong
		}
		return buf, err
	}
}

func trimEOL(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	return b
}

// pidName is what a folded stack's root frame says of its process.
type pidName struct {
	pid  uint32
	name string
}

type reader struct {
	p         *trace.Profile
	locations map[string]*trace.Location
	processes map[pidName]*trace.Process
	samples   map[string]*trace.Sample
}

func (rd *reader) parse(line string) error {
	if strings.TrimSpace(line) == "" {
		return nil
	}
	stack := strings.TrimRight(line, " \t")
	i := strings.LastIndexAny(stack, " \t")
	if i < 0 {
		return fmt.Errorf("no count after the stack: %.80q", line)
	}
	field := stack[i+1:]
	count, err := strconv.ParseInt(field, 10, 64)
	if err != nil || count < 0 {
		return fmt.Errorf("count %.40q is not a whole number of samples", field)
	}
	stack = strings.TrimRight(stack[:i], " \t")
	if stack == "" {
		return fmt.Errorf("no frames before the count")
	}
	if s, ok := rd.samples[stack]; ok {
		if s.Count > math.MaxInt64-count {
			return fmt.Errorf("the count of this stack overflows")
		}
		s.Count += count
		return nil
	}
	s := &trace.Sample{Count: count}
	names := strings.Split(stack, ";")
	if name, pid, ok := frames.ParseProcessName(names[0]); ok {
		key := pidName{pid, name}
		proc := rd.processes[key]
		if proc == nil {
			proc = &trace.Process{PID: pid, Name: name}
			rd.processes[key] = proc
		}
		s.Process = proc
		names = names[1:]
	}
	s.Locations = make([]*trace.Location, len(names))
	for j, name := range names {
		if name == "" {
			name = unknownFrame
		}
		s.Locations[len(names)-1-j] = rd.location(name)
	}
	rd.samples[stack] = s
	rd.p.Samples = append(rd.p.Samples, s)
	return nil
}

func (rd *reader) location(name string) *trace.Location {
	l := rd.locations[name]
	if l == nil {
		l = &trace.Location{Lines: []trace.Line{{Function: name}}}
		rd.locations[name] = l
		rd.p.Locations = append(rd.p.Locations, l)
	}
	return l
}
