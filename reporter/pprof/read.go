package pprof

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/pprof/profile"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

// Read parses a pprof profile, gzip-compressed or not, into one profile spanning the
// file's time. It undoes Write: the labels thread_name, process_name, pid and tid become
// each sample's thread and process, pprof locations become locations with their
// mapping and inlined lines.
//
// What pprof does not carry comes back as well as it can: the frame kind is known only
// for the kernel's mapping; a build ID with a '/' is taken for a Go build ID, any other
// for a GNU one (sonde writes a file's hash there when it has neither). The count is
// the "samples" value when the profile has one, else the first value, divided by the
// period when that value is CPU time, so profiles from other tools read too.
func Read(r io.Reader) (*trace.Profile, error) {
	pp, err := profile.Parse(r)
	if err != nil {
		return nil, fmt.Errorf("read pprof: %w", err)
	}
	return FromPprof(pp)
}

// FromPprof converts a parsed pprof profile; see Read.
func FromPprof(pp *profile.Profile) (*trace.Profile, error) {
	if len(pp.SampleType) == 0 {
		return nil, fmt.Errorf("read pprof: no sample types")
	}
	vi, divisor := countValue(pp)
	off := -1
	for i, st := range pp.SampleType {
		if st.Type == OffCPUType && st.Unit == "nanoseconds" {
			off = i
		}
	}
	p := &trace.Profile{}
	if pp.TimeNanos != 0 {
		p.Start = time.Unix(0, pp.TimeNanos)
		p.End = p.Start.Add(time.Duration(pp.DurationNanos))
	}
	if pp.PeriodType != nil && pp.PeriodType.Unit == "nanoseconds" && pp.Period > 0 {
		p.Period = time.Duration(pp.Period)
	}
	mappings := make(map[*profile.Mapping]*trace.Mapping, len(pp.Mapping))
	for _, m := range pp.Mapping {
		mappings[m] = newMapping(m)
	}
	locs := make(map[*profile.Location]*trace.Location, len(pp.Location))
	for _, pl := range pp.Location {
		l := &trace.Location{Address: pl.Address}
		if pl.Mapping != nil {
			l.Mapping = mappings[pl.Mapping]
			if l.Mapping == nil {
				return nil, fmt.Errorf("read pprof: location %d: mapping %d is not in the profile", pl.ID, pl.Mapping.ID)
			}
			if l.Mapping.Path == trace.KernelPath {
				l.Kind = trace.FrameKernel
			}
		}
		for _, ln := range pl.Line {
			line := trace.Line{Line: ln.Line}
			if f := ln.Function; f != nil {
				line.Function, line.SystemName, line.File = f.Name, f.SystemName, f.Filename
			}
			l.Lines = append(l.Lines, line)
		}
		locs[pl] = l
		p.Locations = append(p.Locations, l)
	}
	type procKey struct {
		pid  int64
		name string
	}
	procs := make(map[procKey]*trace.Process)
	for i, ps := range pp.Sample {
		if vi >= len(ps.Value) {
			return nil, fmt.Errorf("read pprof: sample %d: %d values, want %d", i, len(ps.Value), len(pp.SampleType))
		}
		s := &trace.Sample{Count: ps.Value[vi] / divisor, ThreadName: label(ps, "thread_name")}
		if off >= 0 && off < len(ps.Value) {
			s.OffCPU = max(ps.Value[off], 0)
		}
		if tid, ok := numLabel(ps, "tid"); ok {
			s.TID = uint32(tid)
		}
		pid, hasPID := numLabel(ps, "pid")
		name := label(ps, "process_name")
		if hasPID || name != "" {
			k := procKey{pid, name}
			proc := procs[k]
			if proc == nil {
				proc = &trace.Process{PID: uint32(pid), Name: name}
				procs[k] = proc
			}
			s.Process = proc
		}
		s.Locations = make([]*trace.Location, len(ps.Location))
		for j, pl := range ps.Location {
			l := locs[pl]
			if l == nil {
				return nil, fmt.Errorf("read pprof: sample %d: location %d is not in the profile", i, pl.ID)
			}
			s.Locations[j] = l
		}
		p.Samples = append(p.Samples, s)
	}
	return p, nil
}

// countValue picks the sample value that counts samples: sonde's "samples", else the
// first, which when it is CPU time converts to samples by the period.
func countValue(pp *profile.Profile) (index int, divisor int64) {
	for i, st := range pp.SampleType {
		if st.Type == "samples" && st.Unit == "count" {
			return i, 1
		}
	}
	if pp.SampleType[0].Unit == "nanoseconds" && pp.Period > 0 && pp.PeriodType != nil && pp.PeriodType.Unit == "nanoseconds" {
		return 0, pp.Period
	}
	return 0, 1
}

func newMapping(m *profile.Mapping) *trace.Mapping {
	tm := &trace.Mapping{Start: m.Start, End: m.Limit, Offset: m.Offset, Path: m.File}
	if m.BuildID != "" {
		f := &objfile.File{Path: m.File}
		if strings.Contains(m.BuildID, "/") {
			f.GoBuildID = m.BuildID
		} else {
			f.GNUBuildID = m.BuildID
		}
		tm.File = f
	}
	return tm
}

func label(s *profile.Sample, key string) string {
	if v := s.Label[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func numLabel(s *profile.Sample, key string) (int64, bool) {
	if v := s.NumLabel[key]; len(v) > 0 {
		return v[0], true
	}
	return 0, false
}
