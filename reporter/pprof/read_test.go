package pprof

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/sonde-profiler/sonde/trace"
)

func TestReadUndoesWrite(t *testing.T) {
	start := time.Unix(1700000000, 0)
	var buf bytes.Buffer
	if err := Write(&buf, testProfile(start)); err != nil {
		t.Fatal(err)
	}
	gz := buf.Bytes()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"gzip": gz, "plain": plain} {
		t.Run(name, func(t *testing.T) {
			p, err := Read(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			if !p.Start.Equal(start) || !p.End.Equal(start.Add(10*time.Second)) || p.Period != time.Second/19 {
				t.Errorf("span %v..%v period %v", p.Start, p.End, p.Period)
			}
			if len(p.Samples) != 2 || len(p.Locations) != 5 {
				t.Fatalf("%d samples, %d locations; want 2, 5", len(p.Samples), len(p.Locations))
			}
			s := p.Samples[0]
			if s.Count != 5 || s.TID != 1 || s.ThreadName != "app" || s.Process.PID != 1 || s.Process.Name != "app" {
				t.Errorf("sample 0: %+v process %+v", s, s.Process)
			}
			leaf := s.Locations[0]
			if leaf.Address != 0x400100 || len(leaf.Lines) != 2 || leaf.Lines[0] != (trace.Line{Function: "inlined", File: "a.c", Line: 3}) ||
				leaf.Lines[1].Function != "leaf" {
				t.Errorf("leaf location %+v", leaf)
			}
			if m := leaf.Mapping; m == nil || m.Path != "/bin/app" || m.Start != 0x400000 || m.Offset != 0x1000 || m.File == nil || m.File.GNUBuildID != "abcd" {
				t.Errorf("leaf mapping %+v", m)
			}
			s = p.Samples[1]
			if s.Count != 2 || s.TID != 3 || s.ThreadName != "worker" || s.Process.PID != 2 {
				t.Errorf("sample 1: %+v process %+v", s, s.Process)
			}
			if k := s.Locations[0]; k.Kind != trace.FrameKernel || k.Lines[0].Function != "do_syscall_64" {
				t.Errorf("kernel location %+v", k)
			}
			if u := s.Locations[1]; len(u.Lines) != 0 || u.Address != 0x400300 {
				t.Errorf("unnamed location %+v", u)
			}
			// Writing what was read gives the same pprof samples.
			var again bytes.Buffer
			if err := Write(&again, p); err != nil {
				t.Fatal(err)
			}
			a, _ := profile.Parse(bytes.NewReader(gz))
			b, err := profile.Parse(&again)
			if err != nil {
				t.Fatal(err)
			}
			if sa, sb := samplesText(a), samplesText(b); sa != sb {
				t.Errorf("rewritten samples differ:\n%s\nvs\n%s", sa, sb)
			}
		})
	}
}

// samplesText prints samples with their values, labels and frames, not IDs.
func samplesText(p *profile.Profile) string {
	var b strings.Builder
	for _, s := range p.Sample {
		fmt.Fprintf(&b, "%v %v %v", s.Value, s.Label, s.NumLabel)
		for _, l := range s.Location {
			fmt.Fprintf(&b, " %#x %s/%s", l.Address, l.Mapping.File, l.Mapping.BuildID)
			for _, ln := range l.Line {
				fmt.Fprintf(&b, " %s:%s:%d", ln.Function.Name, ln.Function.Filename, ln.Line)
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func TestReadForeignProfile(t *testing.T) {
	// A Go CPU profile: values are samples/count and cpu/nanoseconds, no labels.
	fn := &profile.Function{ID: 1, Name: "main.spin"}
	m := &profile.Mapping{ID: 1, File: "/bin/x", BuildID: "Abc/def/ghi/jkl"}
	loc := &profile.Location{ID: 1, Mapping: m, Address: 0x10, Line: []profile.Line{{Function: fn, Line: 7}}}
	cpuOnly := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"}, Period: 10_000_000,
		Sample:   []*profile.Sample{{Value: []int64{30_000_000}, Location: []*profile.Location{loc}}},
		Location: []*profile.Location{loc}, Function: []*profile.Function{fn}, Mapping: []*profile.Mapping{m},
	}
	var buf bytes.Buffer
	if err := cpuOnly.Write(&buf); err != nil {
		t.Fatal(err)
	}
	p, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	s := p.Samples[0]
	if s.Count != 3 || s.Process != nil || p.Period != 10*time.Millisecond {
		t.Errorf("count %d (want 3 = 30ms / 10ms), process %v, period %v", s.Count, s.Process, p.Period)
	}
	if f := s.Locations[0].Mapping.File; f == nil || f.GoBuildID != "Abc/def/ghi/jkl" || f.GNUBuildID != "" {
		t.Errorf("Go build ID read as %+v", f)
	}
}

func TestReadGarbage(t *testing.T) {
	for _, in := range []string{"", "not a profile", "\x1f\x8b\x08\x00garbage"} {
		if _, err := Read(strings.NewReader(in)); err == nil || !strings.HasPrefix(err.Error(), "read pprof: ") {
			t.Errorf("Read(%q): error %v", in, err)
		}
	}
}
