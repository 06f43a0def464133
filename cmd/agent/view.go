package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"time"

	"github.com/sonde-profiler/sonde/reporter/files"
	"github.com/sonde-profiler/sonde/reporter/folded"
	"github.com/sonde-profiler/sonde/reporter/merge"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/reporter/pprof"
	"github.com/sonde-profiler/sonde/reporter/top"
	"github.com/sonde-profiler/sonde/trace"
)

const viewAbout = `Reads profiles sonde wrote, pprof (.pb.gz, .pprof), OTLP (.otlp.pb, .otlp.json) or folded
stacks (.folded, .txt), the format told by the name or else by the content ("-" reads
standard input), and OTLP files the OpenTelemetry Collector's file exporter wrote, JSON or
proto, zstd-compressed or not; merges them into one, keeps the samples --focus and --pid
select, prints the hottest functions and writes the result in any format --output names.
Needs neither root nor BPF.`

// viewMain is `sonde view`.
func viewMain(args []string, stdout, stderr io.Writer) int {
	s, err := newSubcommand("view", "sonde view [flags] FILE...", viewAbout, os.Getenv, stderr)
	if err != nil {
		return usageStatus("view", err, stderr)
	}
	focus := s.fs.String("focus", "", "keep the samples with a function matching `REGEXP` (Go syntax; inlined functions and unnamed frames such as \"0x1234 (/lib/x.so)\" match too)")
	pidList := s.fs.String("pid", "", "keep only the samples of the processes `PID[,PID...]`")
	s.share("output", "", "write the merged, filtered profile to `FILE`; the name picks the format: "+files.Names+"; may be given more than once")
	s.share("top", "", "print the `N` hottest functions (0: none)")
	viewName := s.fs.String("view", "", "what the top table, flame graphs and folded stacks weigh stacks by: `cpu`, off-cpu (time waited) or wall (both, as time) (default cpu; off-cpu for a profile of waits only)")
	c, inputs, err := s.parseInterspersed(args)
	if err != nil {
		return usageStatus("view", err, stderr)
	}
	var filter merge.Filter
	if *focus != "" {
		if filter.Focus, err = regexp.Compile(*focus); err != nil {
			return usageStatus("view", fmt.Errorf("--focus: %w", err), stderr)
		}
	}
	if filter.PIDs, err = parsePIDs(*pidList); err != nil {
		return usageStatus("view", err, stderr)
	}
	if len(inputs) == 0 {
		return usageStatus("view", errors.New("no profile to read: name one or more files"), stderr)
	}

	var all []*trace.Profile
	for _, name := range inputs {
		profiles, err := readProfiles(name)
		if err != nil {
			fmt.Fprintf(stderr, "sonde view: %s\n", printable(err.Error()))
			return 1
		}
		all = append(all, profiles...)
	}
	p := filter.Apply(merge.Merge(all...))
	v, err := parseView(*viewName, p.HasOffCPU())
	if err != nil {
		return usageStatus("view", err, stderr)
	}
	if *viewName == "" && (!p.HasOffCPU() || p.TotalCount() > 0) {
		v = trace.ViewCPU
	}
	if c.Top > 0 {
		table := top.NewTable()
		table.Time = files.ViewTime(v)
		table.Add(p.ForView(v))
		if err := table.Print(stdout, c.Top); err != nil {
			fmt.Fprintf(stderr, "sonde view: print top table: %v\n", err)
			return 1
		}
	}
	facts := files.Facts{Encode: otlp.EncodeOptions{Version: version}, Command: os.Args, LostSamples: -1, View: v}
	if p.Period > 0 {
		facts.Frequency = int(time.Second / p.Period)
	}
	status := 0
	for _, o := range c.Outputs {
		if err := o.Write(p, facts); err != nil {
			fmt.Fprintf(stderr, "sonde view: %s\n", printable(err.Error()))
			status = 1
			continue
		}
		fmt.Fprintf(stderr, "wrote %s\n", printable(o.Path))
	}
	return status
}

// parseInterspersed parses flags wherever they are among the arguments, as people type
// `sonde view a.pb.gz --focus x`; after "--" everything is an argument.
func (s *subcommand) parseInterspersed(args []string) (*config, []string, error) {
	var positional []string
	for {
		if err := s.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, nil, err
			}
			return nil, nil, usageError{err}
		}
		rest := s.fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			positional = append(positional, rest...)
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	c, err := s.parse(nil)
	return c, positional, err
}

// readProfiles reads a profile file in any format sonde writes: by its name's extension,
// else by its content. "-" is standard input. OTLP files give one profile per interval.
func readProfiles(name string) ([]*trace.Profile, error) {
	var r io.Reader = os.Stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.IsDir() {
			return nil, fmt.Errorf("read %s: is a directory", name)
		}
		r = f
	}
	br := bufio.NewReaderSize(r, 64<<10)
	format, err := files.FormatOf(name)
	if err != nil || name == "-" {
		format, err = sniff(br)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
	}
	var profiles []*trace.Profile
	switch format {
	case files.Pprof:
		var p *trace.Profile
		if p, err = pprof.Read(br); err == nil {
			profiles = []*trace.Profile{p}
		}
	case files.OTLP, formatOTLPJSON:
		// By content, not name: the Collector writes any of its forms under any name.
		var data []byte
		if data, err = io.ReadAll(br); err == nil {
			profiles, err = otlp.DecodeFile(data)
		}
	case files.Folded:
		var p *trace.Profile
		if p, err = folded.Read(br); err == nil {
			profiles = []*trace.Profile{p}
		}
	case formatProtobuf:
		profiles, err = readProtobuf(br)
	default:
		err = errors.New("a flame graph cannot be read back; read the profile it was made from (.pb.gz, .otlp.pb, .otlp.json, .folded)")
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return profiles, nil
}

// Formats that only sniffing tells apart: OTLP/JSON without its name, and a protobuf
// that is pprof or OTLP.
const (
	formatOTLPJSON files.Format = iota + 100
	formatProtobuf
)

// sniff tells a profile's format from its first bytes.
func sniff(br *bufio.Reader) (files.Format, error) {
	head, err := br.Peek(512)
	if len(head) == 0 {
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		return 0, errors.New("empty file")
	}
	switch trimmed := bytes.TrimLeft(head, " \t\r\n"); {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return files.Pprof, nil // sonde's only gzip-compressed format
	case otlp.IsExporterStream(head):
		// Before the text test: a short zstd frame may hold no control byte.
		return files.OTLP, nil
	case len(trimmed) > 0 && trimmed[0] == '{':
		return formatOTLPJSON, nil
	case isText(head):
		return files.Folded, nil
	default:
		return formatProtobuf, nil
	}
}

// isText reports whether the start of a file looks like folded stacks: printable text,
// no control bytes but line endings and tabs. A protobuf's tags and lengths rarely are.
func isText(head []byte) bool {
	for _, c := range head {
		if c < 0x20 && c != '\n' && c != '\r' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// readProtobuf reads an uncompressed protobuf: pprof, else OTLP, one message or the
// Collector's records. pprof's decoder goes first because it rejects fields of the wrong
// wire type, where OTLP's would skip a pprof profile's fields as unknown ones and find
// nothing; records that could pass for pprof (a first byte of zero) never come here.
func readProtobuf(r io.Reader) ([]*trace.Profile, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	p, perr := pprof.Read(bytes.NewReader(data))
	if perr == nil {
		return []*trace.Profile{p}, nil
	}
	profiles, oerr := otlp.DecodeFile(data)
	if oerr == nil && len(profiles) > 0 {
		return profiles, nil
	}
	return nil, fmt.Errorf("neither pprof (%v) nor OTLP (%v)", perr, cmpErr(oerr, "no profiles"))
}

func cmpErr(err error, otherwise string) string {
	if err != nil {
		return err.Error()
	}
	return otherwise
}
