package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sonde-profiler/sonde/reporter/flame"
	"github.com/sonde-profiler/sonde/reporter/folded"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/reporter/pprof"
	"github.com/sonde-profiler/sonde/trace"
)

// outputFormat is how an output file is written, chosen by its name.
type outputFormat int

const (
	formatPprof outputFormat = iota + 1
	formatOTLP
	formatHTML
	formatSVG
	formatFolded
)

// formatNames is the help text's list of what --output understands.
const formatNames = ".pb.gz or .pprof (gzip pprof), .otlp.pb or .otlp.json (OTLP profiles), .html (flame graph page), .svg (flame graph), .folded or .txt (folded stacks)"

// formatOf picks the format a file name asks for.
func formatOf(name string) (outputFormat, error) {
	lower := strings.ToLower(name)
	for _, f := range []struct {
		suffix string
		format outputFormat
	}{
		{".otlp.pb", formatOTLP}, {".otlp.json", formatOTLP},
		{".pb.gz", formatPprof}, {".pprof", formatPprof},
		{".html", formatHTML}, {".svg", formatSVG},
		{".folded", formatFolded}, {".txt", formatFolded},
	} {
		if strings.HasSuffix(lower, f.suffix) {
			return f.format, nil
		}
	}
	return 0, fmt.Errorf("--output %s: unknown format; name it %s", name, formatNames)
}

// output is a file sonde writes the run to when it stops.
type output struct {
	path   string
	format outputFormat
}

// parseOutput checks, before anything is sampled, that a run's result can be written to
// name: a known format, in a directory that exists, and not a directory or another
// non-file itself. Losing a whole run to a typo at the end is what this prevents.
func parseOutput(name string) (output, error) {
	format, err := formatOf(name)
	if err != nil {
		return output{}, err
	}
	st, err := os.Stat(name)
	switch {
	case err == nil && st.IsDir():
		return output{}, fmt.Errorf("--output %s: is a directory; name a file to write", name)
	case err == nil && !st.Mode().IsRegular():
		return output{}, fmt.Errorf("--output %s: is not a regular file (%v)", name, st.Mode().Type())
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return output{}, fmt.Errorf("--output %s: %w", name, err)
	}
	dir := filepath.Dir(name)
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return output{}, fmt.Errorf("--output %s: cannot write there: %w", name, err)
	}
	return output{path: name, format: format}, nil
}

// runFacts describes the whole run, for the outputs that say more than the samples.
type runFacts struct {
	resource    otlp.Resource
	encode      otlp.EncodeOptions
	frequency   int
	lostSamples int64
	command     []string
	note        string // a word to the reader about the run, such as an idle host's
	// view is what the flame graphs and folded stacks weigh stacks by; pprof and OTLP
	// files keep every sample type.
	view trace.View
}

// write writes p to the output, replacing the file atomically: readers never see half
// of it, a failure leaves nothing behind, and the file gets the mode the umask allows.
func (o output) write(p *trace.Profile, facts runFacts) error {
	return writeAtomically(o.path, func(w io.Writer) error {
		switch o.format {
		case formatOTLP:
			req := otlp.Encode([]*trace.Profile{p}, facts.resource, facts.encode)
			return otlp.Write(w, otlp.IsJSON(strings.ToLower(o.path)), req)
		case formatHTML, formatSVG:
			p := p.ForView(facts.view)
			f := flame.FactsFrom(p)
			f.Host, f.Frequency, f.LostSamples = facts.resource.HostName, float64(facts.frequency), facts.lostSamples
			f.Version, f.CommandLine, f.Note = facts.encode.Version, facts.command, facts.note
			if facts.view != trace.ViewCPU {
				f.Note = strings.TrimSpace(f.Note + " " + viewNote(facts.view))
			}
			if o.format == formatHTML {
				return flame.WriteHTML(w, p, f)
			}
			return flame.WriteSVG(w, p, f)
		case formatFolded:
			return folded.Write(w, p.ForView(facts.view))
		default:
			return pprof.Write(w, p)
		}
	})
}

// viewTime names the time a view's samples stand for, for the top table's summary.
func viewTime(v trace.View) string {
	switch v {
	case trace.ViewOffCPU:
		return "waiting"
	case trace.ViewWall:
		return "wall time"
	}
	return "CPU"
}

// viewNote tells the reader of a flame graph what its samples are in a time view.
func viewNote(v trace.View) string {
	what := "time waited off the CPU"
	if v == trace.ViewWall {
		what = "time on the CPU and off it"
	}
	return fmt.Sprintf("This view weighs stacks by %s: each sample is %v.", what, trace.ViewUnit)
}

// writeAtomically writes a new file at path with write. The file is made unnamed
// (O_TMPFILE) and linked into place only when complete, so a crash leaves no temporary
// file behind; where the file system cannot do that, a hidden temporary file is used and
// removed on failure.
func writeAtomically(path string, write func(io.Writer) error) error {
	dir := filepath.Dir(path)
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o666)
	if err != nil {
		return writeViaTemp(path, write)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if err := write(f); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	proc := "/proc/self/fd/" + strconv.Itoa(fd)
	err = unix.Linkat(unix.AT_FDCWD, proc, unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW)
	if errors.Is(err, unix.EEXIST) {
		// Replace the old file in one step: link beside it, then rename over it.
		tmp := filepath.Join(dir, ".sonde-"+strconv.Itoa(os.Getpid())+"-"+filepath.Base(path))
		os.Remove(tmp)
		if err = unix.Linkat(unix.AT_FDCWD, proc, unix.AT_FDCWD, tmp, unix.AT_SYMLINK_FOLLOW); err == nil {
			if err = os.Rename(tmp, path); err != nil {
				os.Remove(tmp)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func writeViaTemp(path string, write func(io.Writer) error) error {
	tmp := filepath.Join(filepath.Dir(path), ".sonde-"+strconv.Itoa(os.Getpid())+"-"+filepath.Base(path))
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_CLOEXEC, 0o666)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
