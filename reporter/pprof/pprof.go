// Package pprof writes sonde's profiles in the pprof format that `go tool pprof` and most
// profiling backends read, and reads such files back for sonde view.
package pprof

import (
	"encoding/hex"
	"fmt"
	"io"

	"github.com/google/pprof/profile"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

// OffCPUType is the sample type of off-CPU time, in nanoseconds.
const OffCPUType = "off_cpu"

// Build merges profiles (one per interval) into one pprof profile spanning all of them.
func Build(profiles ...*trace.Profile) (*profile.Profile, error) {
	if len(profiles) == 0 {
		return nil, fmt.Errorf("no profiles to write")
	}
	first, last := profiles[0], profiles[len(profiles)-1]
	period := first.Period.Nanoseconds()
	out := &profile.Profile{
		SampleType: []*profile.ValueType{
			{Type: "samples", Unit: "count"},
			{Type: "cpu", Unit: "nanoseconds"},
		},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     period,
	}
	// With off-CPU samples, a third value: how long each stack waited. go tool pprof
	// -sample_index=off_cpu shows it.
	offCPU := false
	for _, p := range profiles {
		offCPU = offCPU || p.HasOffCPU()
	}
	if offCPU {
		out.SampleType = append(out.SampleType, &profile.ValueType{Type: OffCPUType, Unit: "nanoseconds"})
	}
	// Profiles read from folded stacks have no time: pprof's zero says unknown.
	if !first.Start.IsZero() {
		out.TimeNanos = first.Start.UnixNano()
		out.DurationNanos = last.End.Sub(first.Start).Nanoseconds()
	}
	b := builder{out: out, mappings: map[mappingKey]*profile.Mapping{}, functions: map[trace.Line]*profile.Function{}}
	for _, p := range profiles {
		locs := make(map[*trace.Location]*profile.Location, len(p.Locations))
		for _, s := range p.Samples {
			value := []int64{s.Count, s.Count * period}
			if offCPU {
				value = append(value, s.OffCPU)
			}
			ps := &profile.Sample{
				Value:    value,
				Location: make([]*profile.Location, len(s.Locations)),
				Label:    map[string][]string{"thread_name": {s.ThreadName}},
				NumLabel: map[string][]int64{"tid": {int64(s.TID)}},
			}
			// A sample read from folded stacks without a process frame has no process.
			if s.Process != nil {
				ps.Label["process_name"] = []string{s.Process.Name}
				ps.NumLabel["pid"] = []int64{int64(s.Process.PID)}
			}
			addContextLabels(ps, s)
			for i, l := range s.Locations {
				pl, ok := locs[l]
				if !ok {
					pl = b.location(l)
					locs[l] = pl
				}
				ps.Location[i] = pl
			}
			out.Sample = append(out.Sample, ps)
		}
	}
	if err := out.CheckValid(); err != nil {
		return nil, fmt.Errorf("build pprof profile: %w", err)
	}
	return out, nil
}

// Write writes profiles as one gzip-compressed pprof profile.
func Write(w io.Writer, profiles ...*trace.Profile) error {
	p, err := Build(profiles...)
	if err != nil {
		return err
	}
	if err := p.Write(w); err != nil {
		return fmt.Errorf("write pprof: %w", err)
	}
	return nil
}

// mappingKey identifies a mapping by content: processes and intervals that map the same
// file at the same place share one pprof mapping.
type mappingKey struct {
	start, end, offset uint64
	path, buildID      string
}

type builder struct {
	out       *profile.Profile
	mappings  map[mappingKey]*profile.Mapping
	functions map[trace.Line]*profile.Function
}

func buildID(f *objfile.File) string {
	switch {
	case f == nil:
		return ""
	case f.GNUBuildID != "":
		return f.GNUBuildID
	case f.GoBuildID != "":
		return f.GoBuildID
	default:
		return f.HTLHash
	}
}

func (b *builder) mapping(m *trace.Mapping) *profile.Mapping {
	k := mappingKey{start: m.Start, end: m.End, offset: m.Offset, path: m.Path, buildID: buildID(m.File)}
	if pm, ok := b.mappings[k]; ok {
		return pm
	}
	pm := &profile.Mapping{
		ID:      uint64(len(b.out.Mapping) + 1),
		Start:   m.Start,
		Limit:   m.End,
		Offset:  m.Offset,
		File:    m.Path,
		BuildID: k.buildID,
	}
	b.mappings[k] = pm
	b.out.Mapping = append(b.out.Mapping, pm)
	return pm
}

func (b *builder) location(l *trace.Location) *profile.Location {
	pl := &profile.Location{ID: uint64(len(b.out.Location) + 1), Address: l.Address}
	if l.Mapping != nil {
		pl.Mapping = b.mapping(l.Mapping)
		if len(l.Lines) > 0 {
			pl.Mapping.HasFunctions = true
			pl.Mapping.HasFilenames = pl.Mapping.HasFilenames || l.Lines[0].File != ""
			pl.Mapping.HasLineNumbers = pl.Mapping.HasLineNumbers || l.Lines[0].Line != 0
		}
	}
	for _, line := range l.Lines {
		pl.Line = append(pl.Line, profile.Line{Function: b.function(line), Line: line.Line})
	}
	b.out.Location = append(b.out.Location, pl)
	return pl
}

func (b *builder) function(line trace.Line) *profile.Function {
	key := trace.Line{Function: line.Function, SystemName: line.SystemName, File: line.File}
	if f, ok := b.functions[key]; ok {
		return f
	}
	f := &profile.Function{
		ID:         uint64(len(b.out.Function) + 1),
		Name:       line.Function,
		SystemName: line.SystemName,
		Filename:   line.File,
	}
	b.functions[key] = f
	b.out.Function = append(b.out.Function, f)
	return f
}

// addContextLabels labels a sample with the span it was taken in (trace_id and span_id,
// in hex, as Go's own profiling labels name them) and its trace context's attributes,
// except where those would replace a label sonde sets.
func addContextLabels(ps *profile.Sample, s *trace.Sample) {
	if !s.Link.IsZero() {
		ps.Label["trace_id"] = []string{hex.EncodeToString(s.Link.TraceID[:])}
		ps.Label["span_id"] = []string{hex.EncodeToString(s.Link.SpanID[:])}
	}
	for _, a := range s.Attributes {
		if _, taken := ps.Label[a.Key]; !taken {
			ps.Label[a.Key] = []string{a.Value}
		}
	}
}
