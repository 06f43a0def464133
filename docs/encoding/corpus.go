package encoding

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/proto"
)

// Sample is one sample record as sonde sent it: a stack and how often it was seen.
// sonde keys records by process, thread and interval too, so a stack can recur in
// several records; the corpus keeps that multiplicity because stack deduplication is
// what the encodings compete on, and drops the thread attributes, which every encoding
// would carry alike.
type Sample struct {
	// Stack holds indices into Corpus.Dict.LocationTable, leaf first.
	Stack []int32
	Count int64
	// Times are the capture times (Unix ns) of the Count samples when the fixture has
	// them; only the kernel-side simulation and the collector's interval benchmark read
	// them, to replay arrival order.
	Times []uint64
	// PID and TID say where the sample was taken, for replays that keep address spaces
	// and threads apart; the encodings ignore them.
	PID, TID uint32
}

// Corpus is a captured profile reduced to what every encoding must carry.
type Corpus struct {
	Name string
	// Dict holds the mappings, locations, functions, strings and the attributes that
	// locations and mappings use, each table starting with its zero value, and no
	// stack_table: how stacks are written is what the encodings differ in.
	Dict    *profilespb.ProfilesDictionary
	Samples []Sample
	// Period is the CPU time one sample stands for, in nanoseconds.
	Period int64

	// Indices of the sample and period type strings, interned into Dict.
	samplesStr, countStr, cpuStr, nanosStr int32
	// pprofDict is the dictionary as pprof objects, built on first use.
	pprofDict *pprofDict
}

// Load reads a fixture: a binary OTLP ProfilesData as `sonde --output X.otlp.pb`
// writes it, gzip-compressed when the name ends in .gz.
func Load(path string) (*Corpus, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load corpus: %w", err)
	}
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("load corpus %s: %w", path, err)
		}
		if data, err = io.ReadAll(zr); err != nil {
			return nil, fmt.Errorf("load corpus %s: %w", path, err)
		}
	}
	var pd profilespb.ProfilesData
	if err := proto.Unmarshal(data, &pd); err != nil {
		return nil, fmt.Errorf("load corpus %s: %w", path, err)
	}
	name := strings.TrimSuffix(filepath.Base(path), ".gz")
	name = strings.TrimSuffix(name, ".otlp.pb")
	c, err := FromProfilesData(name, &pd)
	if err != nil {
		return nil, fmt.Errorf("load corpus %s: %w", path, err)
	}
	return c, nil
}

// FromProfilesData flattens every profile of pd into one corpus, in file order, with a
// dictionary compacted to the entries the samples reach.
func FromProfilesData(name string, pd *profilespb.ProfilesData) (*Corpus, error) {
	src := pd.GetDictionary()
	if src == nil {
		return nil, fmt.Errorf("no dictionary")
	}
	cp := newCompactor(src)
	c := &Corpus{Name: name, Dict: cp.dst}
	for _, rp := range pd.ResourceProfiles {
		pid := uint32(intAttr(rp.GetResource().GetAttributes(), "process.pid"))
		for _, sp := range rp.ScopeProfiles {
			for _, p := range sp.Profiles {
				if c.Period == 0 {
					c.Period = p.Period
				}
				for _, s := range p.Samples {
					if int(s.StackIndex) >= len(src.StackTable) || s.StackIndex < 0 {
						return nil, fmt.Errorf("sample names stack %d of %d", s.StackIndex, len(src.StackTable))
					}
					locs := src.StackTable[s.StackIndex].LocationIndices
					stack := make([]int32, len(locs))
					for i, l := range locs {
						li, err := cp.location(l)
						if err != nil {
							return nil, err
						}
						stack[i] = li
					}
					out := Sample{Stack: stack, PID: pid, TID: uint32(sampleIntAttr(src, s.AttributeIndices, "thread.id"))}
					if n := len(s.TimestampsUnixNano); n > 0 {
						out.Count = int64(n)
						out.Times = append([]uint64(nil), s.TimestampsUnixNano...)
					}
					for _, v := range s.Values {
						out.Count += v
					}
					if out.Count > 0 {
						c.Samples = append(c.Samples, out)
					}
				}
			}
		}
	}
	if len(c.Samples) == 0 {
		return nil, fmt.Errorf("no samples")
	}
	c.samplesStr, c.countStr = cp.str("samples"), cp.str("count")
	c.cpuStr, c.nanosStr = cp.str("cpu"), cp.str("nanoseconds")
	return c, nil
}

// compactor copies the dictionary entries that samples reach, so fixtures trimmed of
// samples (or captured with thread attributes) carry no dead weight into the sizes.
type compactor struct {
	src, dst             *profilespb.ProfilesDictionary
	strs                 map[string]int32
	fns, maps, locs, att map[int32]int32
}

func newCompactor(src *profilespb.ProfilesDictionary) *compactor {
	return &compactor{
		src: src,
		dst: &profilespb.ProfilesDictionary{
			MappingTable:   []*profilespb.Mapping{{}},
			LocationTable:  []*profilespb.Location{{}},
			FunctionTable:  []*profilespb.Function{{}},
			LinkTable:      []*profilespb.Link{{TraceId: make([]byte, 16), SpanId: make([]byte, 8)}},
			StringTable:    []string{""},
			AttributeTable: []*profilespb.KeyValueAndUnit{{}},
		},
		strs: map[string]int32{"": 0},
		fns:  map[int32]int32{0: 0},
		maps: map[int32]int32{0: 0},
		locs: map[int32]int32{0: 0},
		att:  map[int32]int32{0: 0},
	}
}

func (c *compactor) str(s string) int32 {
	if i, ok := c.strs[s]; ok {
		return i
	}
	i := int32(len(c.dst.StringTable))
	c.dst.StringTable = append(c.dst.StringTable, s)
	c.strs[s] = i
	return i
}

func (c *compactor) strIndex(i int32) (int32, error) {
	if i < 0 || int(i) >= len(c.src.StringTable) {
		return 0, fmt.Errorf("string %d of %d", i, len(c.src.StringTable))
	}
	return c.str(c.src.StringTable[i]), nil
}

func (c *compactor) attrs(idx []int32) ([]int32, error) {
	if len(idx) == 0 {
		return nil, nil
	}
	out := make([]int32, len(idx))
	for n, i := range idx {
		if j, ok := c.att[i]; ok {
			out[n] = j
			continue
		}
		if i < 0 || int(i) >= len(c.src.AttributeTable) {
			return nil, fmt.Errorf("attribute %d of %d", i, len(c.src.AttributeTable))
		}
		a := c.src.AttributeTable[i]
		key, err := c.strIndex(a.KeyStrindex)
		if err != nil {
			return nil, err
		}
		unit, err := c.strIndex(a.UnitStrindex)
		if err != nil {
			return nil, err
		}
		j := int32(len(c.dst.AttributeTable))
		c.dst.AttributeTable = append(c.dst.AttributeTable, &profilespb.KeyValueAndUnit{
			KeyStrindex: key, UnitStrindex: unit, Value: proto.Clone(a.Value).(*commonpb.AnyValue),
		})
		c.att[i] = j
		out[n] = j
	}
	return out, nil
}

func (c *compactor) mapping(i int32) (int32, error) {
	if j, ok := c.maps[i]; ok {
		return j, nil
	}
	if i < 0 || int(i) >= len(c.src.MappingTable) {
		return 0, fmt.Errorf("mapping %d of %d", i, len(c.src.MappingTable))
	}
	m := c.src.MappingTable[i]
	file, err := c.strIndex(m.FilenameStrindex)
	if err != nil {
		return 0, err
	}
	attrs, err := c.attrs(m.AttributeIndices)
	if err != nil {
		return 0, err
	}
	j := int32(len(c.dst.MappingTable))
	c.dst.MappingTable = append(c.dst.MappingTable, &profilespb.Mapping{
		MemoryStart: m.MemoryStart, MemoryLimit: m.MemoryLimit, FileOffset: m.FileOffset,
		FilenameStrindex: file, AttributeIndices: attrs,
	})
	c.maps[i] = j
	return j, nil
}

func (c *compactor) function(i int32) (int32, error) {
	if j, ok := c.fns[i]; ok {
		return j, nil
	}
	if i < 0 || int(i) >= len(c.src.FunctionTable) {
		return 0, fmt.Errorf("function %d of %d", i, len(c.src.FunctionTable))
	}
	f := c.src.FunctionTable[i]
	var idx [3]int32
	for n, s := range [...]int32{f.NameStrindex, f.SystemNameStrindex, f.FilenameStrindex} {
		var err error
		if idx[n], err = c.strIndex(s); err != nil {
			return 0, err
		}
	}
	j := int32(len(c.dst.FunctionTable))
	c.dst.FunctionTable = append(c.dst.FunctionTable, &profilespb.Function{
		NameStrindex: idx[0], SystemNameStrindex: idx[1], FilenameStrindex: idx[2], StartLine: f.StartLine,
	})
	c.fns[i] = j
	return j, nil
}

func (c *compactor) location(i int32) (int32, error) {
	if j, ok := c.locs[i]; ok {
		return j, nil
	}
	if i <= 0 || int(i) >= len(c.src.LocationTable) {
		// Index 0 is the zero location: a stack naming it has lost a frame, which
		// pprof, needing nonzero IDs, could not carry.
		return 0, fmt.Errorf("stack names location %d of %d", i, len(c.src.LocationTable))
	}
	l := c.src.LocationTable[i]
	m, err := c.mapping(l.MappingIndex)
	if err != nil {
		return 0, err
	}
	attrs, err := c.attrs(l.AttributeIndices)
	if err != nil {
		return 0, err
	}
	out := &profilespb.Location{MappingIndex: m, Address: l.Address, AttributeIndices: attrs}
	for _, ln := range l.Lines {
		f, err := c.function(ln.FunctionIndex)
		if err != nil {
			return 0, err
		}
		out.Lines = append(out.Lines, &profilespb.Line{FunctionIndex: f, Line: ln.Line, Column: ln.Column})
	}
	j := int32(len(c.dst.LocationTable))
	c.dst.LocationTable = append(c.dst.LocationTable, out)
	c.locs[i] = j
	return j, nil
}

// Stats describes a corpus for the study's corpus table.
type Stats struct {
	Records        int     // sample records
	Samples        int64   // samples taken: the records' counts added up
	DistinctStacks int     // different stacks among the records
	Locations      int     // dictionary locations, without the zero entry
	Functions      int     // dictionary functions, without the zero entry
	MeanDepth      float64 // frames per sample taken
	MedianDepth    int     // of the samples taken
	MaxDepth       int
	// MeanStackDepth is the mean over distinct stacks, the depth an encoding writes.
	MeanStackDepth float64
}

// Stats measures c.
func (c *Corpus) Stats() Stats {
	st := Stats{Records: len(c.Samples), Locations: len(c.Dict.LocationTable) - 1, Functions: len(c.Dict.FunctionTable) - 1}
	seen := make(map[string]bool)
	var frames, stackFrames int64
	depths := make(map[int]int64)
	for _, s := range c.Samples {
		st.Samples += s.Count
		frames += s.Count * int64(len(s.Stack))
		depths[len(s.Stack)] += s.Count
		st.MaxDepth = max(st.MaxDepth, len(s.Stack))
		k := string(appendStackKey(nil, s.Stack))
		if !seen[k] {
			seen[k] = true
			stackFrames += int64(len(s.Stack))
		}
	}
	st.DistinctStacks = len(seen)
	st.MeanDepth = float64(frames) / float64(st.Samples)
	st.MeanStackDepth = float64(stackFrames) / float64(st.DistinctStacks)
	ds := make([]int, 0, len(depths))
	for d := range depths {
		ds = append(ds, d)
	}
	sort.Ints(ds)
	var acc int64
	for _, d := range ds {
		acc += depths[d]
		if 2*acc >= st.Samples {
			st.MedianDepth = d
			break
		}
	}
	return st
}

func intAttr(attrs []*commonpb.KeyValue, key string) int64 {
	for _, a := range attrs {
		if a.GetKey() == key {
			return a.GetValue().GetIntValue()
		}
	}
	return 0
}

func sampleIntAttr(d *profilespb.ProfilesDictionary, idx []int32, key string) int64 {
	for _, i := range idx {
		if i <= 0 || int(i) >= len(d.AttributeTable) {
			continue
		}
		a := d.AttributeTable[i]
		if int(a.KeyStrindex) < len(d.StringTable) && d.StringTable[a.KeyStrindex] == key {
			return a.GetValue().GetIntValue()
		}
	}
	return 0
}
