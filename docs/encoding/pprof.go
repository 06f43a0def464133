package encoding

import (
	"bytes"
	"fmt"

	"github.com/google/pprof/profile"
)

// Mapping attribute keys sonde writes; pprof carries one build ID, picked as sonde's
// pprof writer does.
const (
	keyBuildIDGNU     = "process.executable.build_id.gnu"
	keyBuildIDGo      = "process.executable.build_id.go"
	keyBuildIDHTLHash = "process.executable.build_id.htlhash"
)

// PprofCodec is encoding (1): pprof's Sample.location_id, every sample listing its
// stack in full.
func PprofCodec() Codec {
	return Codec{
		Name:   "pprof",
		Desc:   "each sample lists its location IDs",
		New:    func() Encoder { return &pprofEncoder{} },
		Decode: decodePprof,
	}
}

// pprofDict is the corpus dictionary as pprof objects, built once per corpus: like
// the OTLP encodings, the pprof encoder starts from a dictionary it already holds.
type pprofDict struct {
	locs      []*profile.Location // indexed by corpus location index; [0] nil
	locList   []*profile.Location
	mappings  []*profile.Mapping
	functions []*profile.Function
}

func (c *Corpus) pprof() *pprofDict {
	if c.pprofDict != nil {
		return c.pprofDict
	}
	d := c.Dict
	str := func(i int32) string { return d.StringTable[i] }
	pd := &pprofDict{locs: make([]*profile.Location, len(d.LocationTable))}
	maps := make([]*profile.Mapping, len(d.MappingTable))
	for i, m := range d.MappingTable[1:] {
		pm := &profile.Mapping{
			ID: uint64(i + 1), Start: m.MemoryStart, Limit: m.MemoryLimit, Offset: m.FileOffset,
			File: str(m.FilenameStrindex),
		}
		ids := map[string]string{}
		for _, a := range m.AttributeIndices {
			kv := d.AttributeTable[a]
			ids[str(kv.KeyStrindex)] = kv.GetValue().GetStringValue()
		}
		for _, k := range []string{keyBuildIDGNU, keyBuildIDGo, keyBuildIDHTLHash} {
			if ids[k] != "" {
				pm.BuildID = ids[k]
				break
			}
		}
		maps[i+1] = pm
		pd.mappings = append(pd.mappings, pm)
	}
	fns := make([]*profile.Function, len(d.FunctionTable))
	for i, f := range d.FunctionTable[1:] {
		pf := &profile.Function{
			ID: uint64(i + 1), Name: str(f.NameStrindex), SystemName: str(f.SystemNameStrindex),
			Filename: str(f.FilenameStrindex), StartLine: f.StartLine,
		}
		fns[i+1] = pf
		pd.functions = append(pd.functions, pf)
	}
	for i, l := range d.LocationTable[1:] {
		// The location ID is the corpus index, so decoding needs no remapping.
		pl := &profile.Location{ID: uint64(i + 1), Address: l.Address}
		if l.MappingIndex != 0 {
			pl.Mapping = maps[l.MappingIndex]
		}
		for _, ln := range l.Lines {
			pl.Line = append(pl.Line, profile.Line{Function: fns[ln.FunctionIndex], Line: ln.Line, Column: ln.Column})
		}
		pd.locs[i+1] = pl
		pd.locList = append(pd.locList, pl)
	}
	c.pprofDict = pd
	return pd
}

type pprofEncoder struct {
	p   *profile.Profile // kept after Encode: an agent holds it while it writes
	buf bytes.Buffer
}

func (e *pprofEncoder) Encode(c *Corpus) ([]byte, error) {
	d := c.pprof()
	n := 0
	for _, s := range c.Samples {
		n += len(s.Stack)
	}
	// Slabs, as sonde's own pprof writer would want: one allocation each for the
	// samples, their location pointers and their values.
	samples := make([]profile.Sample, len(c.Samples))
	ptrs := make([]*profile.Sample, len(c.Samples))
	locs := make([]*profile.Location, n)
	values := make([]int64, len(c.Samples))
	for i, s := range c.Samples {
		l := locs[:len(s.Stack):len(s.Stack)]
		locs = locs[len(s.Stack):]
		for j, li := range s.Stack {
			l[j] = d.locs[li]
		}
		values[i] = s.Count
		samples[i] = profile.Sample{Location: l, Value: values[i : i+1 : i+1]}
		ptrs[i] = &samples[i]
	}
	e.p = &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     c.Period,
		Sample:     ptrs,
		Mapping:    d.mappings,
		Location:   d.locList,
		Function:   d.functions,
	}
	e.buf.Reset()
	if err := e.p.WriteUncompressed(&e.buf); err != nil {
		return nil, fmt.Errorf("encode pprof: %w", err)
	}
	return e.buf.Bytes(), nil
}

type pprofDecoded struct{ p *profile.Profile }

func decodePprof(b []byte) (Decoded, error) {
	p, err := profile.ParseUncompressed(b)
	if err != nil {
		return nil, fmt.Errorf("decode pprof: %w", err)
	}
	return pprofDecoded{p}, nil
}

func (d pprofDecoded) Samples() ([]Sample, error) {
	out := make([]Sample, len(d.p.Sample))
	for i, s := range d.p.Sample {
		stack := make([]int32, len(s.Location))
		for j, l := range s.Location {
			stack[j] = int32(l.ID)
		}
		if len(s.Value) != 1 {
			return nil, fmt.Errorf("decode pprof: sample %d has %d values", i, len(s.Value))
		}
		out[i] = Sample{Stack: stack, Count: s.Value[0]}
	}
	return out, nil
}
