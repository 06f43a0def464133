package merge

import (
	"encoding/binary"
	"math"
	"regexp"
	"slices"

	"github.com/sonde-profiler/sonde/reporter/internal/frames"
	"github.com/sonde-profiler/sonde/trace"
)

// Merge returns one profile holding the samples of all the profiles, spanning all of
// them. Samples are the same, and their counts and timestamps summed, when their
// process (PID and name), thread (ID and name) and stack are: stacks compare by value,
// location by location (mapping path and build ID, address, and lines), so the same
// code read from different files, or from different intervals, merges. Frame kinds and
// name sources do not take part: not every format keeps them. The period is the first
// profile's that has one. Inputs are not modified; the result shares no samples with
// them, but shares their locations and processes.
func Merge(profiles ...*trace.Profile) *trace.Profile {
	m := NewMerger(0)
	for _, p := range profiles {
		m.Add(p)
	}
	return m.Profile()
}

// Merger merges profiles one at a time, as they come: a long run written to one file
// holds one merged profile, not every interval.
type Merger struct {
	m merger
	// max bounds the distinct samples kept; 0 means no bound.
	max     int
	dropped int64
}

// NewMerger returns an empty Merger keeping at most maxSamples distinct samples (0: no
// bound). Past the bound, samples that match no kept one are counted in Dropped and left
// out: memory stays bounded however long the run and however many stacks it sees.
func NewMerger(maxSamples int) *Merger {
	return &Merger{max: maxSamples, m: merger{
		out:       &trace.Profile{},
		byPtr:     make(map[*trace.Location]uint32),
		byValue:   make(map[string]uint32),
		processes: make(map[processKey]*trace.Process),
		samples:   make(map[string]*trace.Sample),
	}}
}

// Add merges p into what was added so far.
func (mg *Merger) Add(p *trace.Profile) {
	if p == nil {
		return
	}
	m := &mg.m
	if !p.Start.IsZero() && (m.out.Start.IsZero() || p.Start.Before(m.out.Start)) {
		m.out.Start = p.Start
	}
	if p.End.After(m.out.End) {
		m.out.End = p.End
	}
	if m.out.Period == 0 {
		m.out.Period = p.Period
	}
	for _, s := range p.Samples {
		if !m.add(s, mg.max) {
			mg.dropped += s.Count
		}
	}
}

// Profile returns the merged profile. It stays the Merger's: later Adds change it.
func (mg *Merger) Profile() *trace.Profile { return mg.m.out }

// Dropped is how many samples (sums of counts) the bound left out.
func (mg *Merger) Dropped() int64 { return mg.dropped }

type processKey struct {
	pid   uint32
	name  string
	known bool
}

type merger struct {
	out *trace.Profile
	// Locations are numbered by their index in out.Locations: byPtr remembers the
	// number of an input location, byValue that of a location's value.
	byPtr     map[*trace.Location]uint32
	byValue   map[string]uint32
	processes map[processKey]*trace.Process
	samples   map[string]*trace.Sample
	keyBuf    []byte
}

// add merges one sample; it returns false when the sample is new and max distinct
// samples (if max > 0) are kept already.
func (m *merger) add(s *trace.Sample, max int) bool {
	var pk processKey
	if s.Process != nil {
		pk = processKey{pid: s.Process.PID, name: s.Process.Name, known: true}
	}
	proc, ok := m.processes[pk]
	if !ok && s.Process != nil {
		proc = s.Process
		m.processes[pk] = proc
	}
	key := appendString(m.keyBuf[:0], pk.name)
	key = binary.LittleEndian.AppendUint32(key, pk.pid)
	key = append(key, boolByte(pk.known))
	key = binary.LittleEndian.AppendUint32(key, s.TID)
	key = appendString(key, s.ThreadName)
	// Samples of different spans stay apart, as they do in an interval.
	key = append(key, s.Link.TraceID[:]...)
	key = append(key, s.Link.SpanID[:]...)
	key = binary.AppendUvarint(key, uint64(len(s.Attributes)))
	for _, a := range s.Attributes {
		key = appendString(appendString(key, a.Key), a.Value)
	}
	for _, l := range s.Locations {
		key = binary.LittleEndian.AppendUint32(key, m.location(l))
	}
	m.keyBuf = key
	if ms, ok := m.samples[string(key)]; ok {
		if ms.Count > math.MaxInt64-s.Count {
			ms.Count = math.MaxInt64 // a hostile file's counts saturate rather than wrap
		} else {
			ms.Count += s.Count
		}
		if ms.OffCPU > math.MaxInt64-s.OffCPU {
			ms.OffCPU = math.MaxInt64
		} else {
			ms.OffCPU += s.OffCPU
		}
		ms.Timestamps = append(ms.Timestamps, s.Timestamps...)
		return true
	}
	if max > 0 && len(m.out.Samples) >= max {
		return false
	}
	ms := &trace.Sample{
		Process:    proc,
		TID:        s.TID,
		ThreadName: s.ThreadName,
		Count:      s.Count,
		OffCPU:     s.OffCPU,
		Timestamps: slices.Clone(s.Timestamps),
		Link:       s.Link,
		Attributes: s.Attributes,
		Locations:  make([]*trace.Location, len(s.Locations)),
	}
	for i, l := range s.Locations {
		ms.Locations[i] = m.out.Locations[m.byPtr[l]]
	}
	m.samples[string(key)] = ms
	m.out.Samples = append(m.out.Samples, ms)
	return true
}

func (m *merger) location(l *trace.Location) uint32 {
	if id, ok := m.byPtr[l]; ok {
		return id
	}
	k := string(locationKey(nil, l))
	id, ok := m.byValue[k]
	if !ok {
		id = uint32(len(m.out.Locations))
		m.out.Locations = append(m.out.Locations, l)
		m.byValue[k] = id
	}
	m.byPtr[l] = id
	return id
}

func locationKey(b []byte, l *trace.Location) []byte {
	if l == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	if mp := l.Mapping; mp != nil {
		b = append(b, 1)
		b = appendString(b, mp.Path)
		if f := mp.File; f != nil {
			b = appendString(b, f.GNUBuildID)
			b = appendString(b, f.GoBuildID)
			b = appendString(b, f.HTLHash)
		}
	}
	b = append(b, 0)
	b = binary.LittleEndian.AppendUint64(b, l.Address)
	for _, ln := range l.Lines {
		b = appendString(b, ln.Function)
		b = appendString(b, ln.SystemName)
		b = appendString(b, ln.File)
		b = binary.LittleEndian.AppendUint64(b, uint64(ln.Line))
	}
	return b
}

// appendString appends s with its length, so that no two sequences of strings share a key.
func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// Filter says which samples to keep; the zero Filter keeps them all.
type Filter struct {
	// Focus keeps the samples with a frame whose function name matches, inlined
	// functions and unnamed frames ("0x1234 (/lib/x.so)") included.
	Focus *regexp.Regexp
	// PIDs keeps the samples of these processes.
	PIDs []uint32
}

// Apply returns a profile with the samples of p that f keeps and the locations they
// use. The samples are p's own, not copies.
func (f Filter) Apply(p *trace.Profile) *trace.Profile {
	out := &trace.Profile{Start: p.Start, End: p.End, Period: p.Period}
	// A frame's name is matched once per location, not once per sample.
	matches := make(map[*trace.Location]bool)
	listed := make(map[*trace.Location]bool)
	for _, s := range p.Samples {
		if !f.keep(s, matches) {
			continue
		}
		out.Samples = append(out.Samples, s)
		for _, l := range s.Locations {
			if !listed[l] {
				listed[l] = true
				out.Locations = append(out.Locations, l)
			}
		}
	}
	return out
}

func (f Filter) keep(s *trace.Sample, matches map[*trace.Location]bool) bool {
	if len(f.PIDs) > 0 && (s.Process == nil || !slices.Contains(f.PIDs, s.Process.PID)) {
		return false
	}
	if f.Focus == nil {
		return true
	}
	for _, l := range s.Locations {
		match, ok := matches[l]
		if !ok {
			one := trace.Sample{Locations: []*trace.Location{l}}
			for _, fr := range frames.Stack(nil, &one, false) {
				if f.Focus.MatchString(fr.Name) {
					match = true
					break
				}
			}
			matches[l] = match
		}
		if match {
			return true
		}
	}
	return false
}
