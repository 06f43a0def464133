// Package files writes a profile to a file in the format its name picks (pprof, OTLP, a
// flame graph page or image, folded stacks), replacing the file atomically; and checks,
// before a run, that such a file can be written.
package files

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

// Format is how an output file is written, chosen by its name.
type Format int

const (
	Pprof Format = iota + 1
	OTLP
	HTML
	SVG
	Folded
)

// Names is the help text's list of the names the formats are picked by.
const Names = ".pb.gz or .pprof (gzip pprof), .otlp.pb or .otlp.json (OTLP profiles), .html (flame graph page), .svg (flame graph), .folded or .txt (folded stacks)"

// FormatOf picks the format a file name asks for.
func FormatOf(name string) (Format, error) {
	lower := strings.ToLower(name)
	for _, f := range []struct {
		suffix string
		format Format
	}{
		{".otlp.pb", OTLP}, {".otlp.json", OTLP},
		{".pb.gz", Pprof}, {".pprof", Pprof},
		{".html", HTML}, {".svg", SVG},
		{".folded", Folded}, {".txt", Folded},
	} {
		if strings.HasSuffix(lower, f.suffix) {
			return f.format, nil
		}
	}
	return 0, fmt.Errorf("--output %s: unknown format; name it %s", name, Names)
}

// Output is a file sonde writes a profile to.
type Output struct {
	Path   string
	Format Format
}

// Parse checks, before anything is sampled, that a run's result can be written to
// name: a known format, in a directory that exists, and not a directory or another
// non-file itself. Losing a whole run to a typo at the end is what this prevents.
func Parse(name string) (Output, error) {
	format, err := FormatOf(name)
	if err != nil {
		return Output{}, err
	}
	st, err := os.Stat(name)
	switch {
	case err == nil && st.IsDir():
		return Output{}, fmt.Errorf("--output %s: is a directory; name a file to write", name)
	case err == nil && !st.Mode().IsRegular():
		return Output{}, fmt.Errorf("--output %s: is not a regular file (%v)", name, st.Mode().Type())
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return Output{}, fmt.Errorf("--output %s: %w", name, err)
	}
	dir := filepath.Dir(name)
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return Output{}, fmt.Errorf("--output %s: cannot write there: %w", name, err)
	}
	return Output{Path: name, Format: format}, nil
}

// Facts describes the whole run, for the outputs that say more than the samples.
type Facts struct {
	Resource    otlp.Resource
	Encode      otlp.EncodeOptions
	Frequency   int
	LostSamples int64 // -1: not known
	Command     []string
	Note        string // a word to the reader about the run, such as an idle host's
	// View is what the flame graphs and folded stacks weigh stacks by; pprof and OTLP
	// files keep every sample type.
	View trace.View
}

// Write writes p to the output, replacing the file atomically: readers never see half
// of it, a failure leaves nothing behind, and the file gets the mode the umask allows.
func (o Output) Write(p *trace.Profile, facts Facts) error {
	return writeAtomically(o.Path, func(w io.Writer) error {
		switch o.Format {
		case OTLP:
			req := otlp.Encode([]*trace.Profile{p}, facts.Resource, facts.Encode)
			return otlp.Write(w, otlp.IsJSON(strings.ToLower(o.Path)), req)
		case HTML, SVG:
			p := p.ForView(facts.View)
			f := flame.FactsFrom(p)
			f.Host, f.Frequency, f.LostSamples = facts.Resource.HostName, float64(facts.Frequency), facts.LostSamples
			f.Version, f.CommandLine, f.Note = facts.Encode.Version, facts.Command, facts.Note
			if facts.View != trace.ViewCPU {
				f.Note = strings.TrimSpace(f.Note + " " + viewNote(facts.View))
			}
			if o.Format == HTML {
				return flame.WriteHTML(w, p, f)
			}
			return flame.WriteSVG(w, p, f)
		case Folded:
			return folded.Write(w, p.ForView(facts.View))
		default:
			return pprof.Write(w, p)
		}
	})
}

// ViewTime names the time a view's samples stand for, for a top table's summary.
func ViewTime(v trace.View) string {
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
