package otlp

import (
	"cmp"
	"crypto/rand"
	"slices"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/profiles/v1development"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// MaxRequestBytes is the largest request a collector takes with default settings:
// gRPC servers, the collector's OTLP receiver among them, refuse messages over 4 MiB.
const MaxRequestBytes = 4 << 20

// Split returns req as it is when its marshalled size is at most maxBytes
// (MaxRequestBytes when maxBytes <= 0), and otherwise as several requests that each
// are, with their own dictionary holding just what their samples use. Processes are
// kept whole in one part when they fit in one; only a process too big on its own is
// split, by samples. The parts of a profile after the first get profile IDs of their
// own, since consumers may deduplicate by ID. Nothing is dropped: a part that cannot
// be split further, a single sample, is returned even if still too big.
func Split(req *collectorpb.ExportProfilesServiceRequest, maxBytes int) []*collectorpb.ExportProfilesServiceRequest {
	if maxBytes <= 0 {
		maxBytes = MaxRequestBytes
	}
	if proto.Size(req) <= maxBytes {
		return []*collectorpb.ExportProfilesServiceRequest{req}
	}
	refs := flatten(req)
	// Part sizes are tracked entry by entry, which misses only how the length
	// prefixes of enclosing messages grow: leave room for that, and for the sample
	// that takes a part past the target.
	target := maxBytes - maxBytes/32
	var built []*partBuilder
	var cur *partBuilder
	flush := func() {
		if cur != nil && len(cur.refs) > 0 {
			built = append(built, cur.finish(maxBytes)...)
		}
		cur = nil
	}
	for lo := 0; lo < len(refs); {
		hi := lo + 1
		for hi < len(refs) && refs[hi].resource == refs[lo].resource {
			hi++
		}
		group := refs[lo:hi]
		lo = hi
		// A process's size on its own bounds what it adds to a part.
		alone := buildPart(req, group).size
		if cur != nil && cur.size+alone <= target {
			cur.addAll(group)
			continue
		}
		flush()
		cur = newPartBuilder(req)
		if alone <= target {
			cur.addAll(group)
			continue
		}
		// Samples of one stack share all its dictionary entries: keep them together.
		slices.SortStableFunc(group, func(a, b sampleRef) int {
			return cmp.Or(cmp.Compare(a.scope, b.scope), cmp.Compare(a.profile, b.profile),
				cmp.Compare(stackOf(req, a), stackOf(req, b)))
		})
		for _, r := range group {
			cur.add(r)
			if cur.size >= target {
				flush()
				cur = newPartBuilder(req)
			}
		}
	}
	flush()
	// A profile cut into parts: the first keeps its ID and original payload, the
	// others get IDs of their own.
	out := make([]*collectorpb.ExportProfilesServiceRequest, len(built))
	seen := make(map[*profilespb.Profile]bool)
	for i, b := range built {
		for _, pc := range b.profiles {
			if seen[pc.src] {
				if len(pc.dst.ProfileId) > 0 {
					pc.dst.ProfileId = newProfileID(rand.Reader)
				}
				pc.dst.OriginalPayloadFormat, pc.dst.OriginalPayload = "", nil
			}
			seen[pc.src] = true
		}
		out[i] = b.part
	}
	return out
}

func stackOf(req *collectorpb.ExportProfilesServiceRequest, r sampleRef) int32 {
	if r.sample < 0 {
		return -1
	}
	return req.ResourceProfiles[r.resource].ScopeProfiles[r.scope].Profiles[r.profile].Samples[r.sample].StackIndex
}

// sampleRef locates one sample of a request; -1 stands for "none" so that resources,
// scopes and profiles without samples still appear in some part.
type sampleRef struct{ resource, scope, profile, sample int32 }

func flatten(req *collectorpb.ExportProfilesServiceRequest) []sampleRef {
	var refs []sampleRef
	for ri, rp := range req.ResourceProfiles {
		if len(rp.ScopeProfiles) == 0 {
			refs = append(refs, sampleRef{int32(ri), -1, -1, -1})
			continue
		}
		for si, sp := range rp.ScopeProfiles {
			if len(sp.Profiles) == 0 {
				refs = append(refs, sampleRef{int32(ri), int32(si), -1, -1})
				continue
			}
			for pi, p := range sp.Profiles {
				if len(p.Samples) == 0 {
					refs = append(refs, sampleRef{int32(ri), int32(si), int32(pi), -1})
					continue
				}
				for k := range p.Samples {
					refs = append(refs, sampleRef{int32(ri), int32(si), int32(pi), int32(k)})
				}
			}
		}
	}
	return refs
}

// partBuilder builds a request of some samples of src, with a dictionary of just
// the entries they reference, and keeps track of its marshalled size.
type partBuilder struct {
	src     *collectorpb.ExportProfilesServiceRequest
	s       *subsetter
	part    *collectorpb.ExportProfilesServiceRequest
	refs    []sampleRef
	size    int
	rp      *profilespb.ResourceProfiles
	sp      *profilespb.ScopeProfiles
	prof    *profilespb.Profile
	srcProf *profilespb.Profile
	last    sampleRef
	// profiles pairs the part's profiles with those of src they hold samples of.
	profiles []profileCopy
}

type profileCopy struct{ dst, src *profilespb.Profile }

func newPartBuilder(src *collectorpb.ExportProfilesServiceRequest) *partBuilder {
	b := &partBuilder{
		src:  src,
		s:    newSubsetter(src.Dictionary),
		part: &collectorpb.ExportProfilesServiceRequest{},
		last: sampleRef{-1, -1, -1, -1},
	}
	b.part.Dictionary = b.s.dst
	b.s.size = &b.size
	b.size = fieldSize(proto.Size(b.s.dst))
	return b
}

func buildPart(src *collectorpb.ExportProfilesServiceRequest, refs []sampleRef) *partBuilder {
	b := newPartBuilder(src)
	b.addAll(refs)
	return b
}

func (b *partBuilder) addAll(refs []sampleRef) {
	for _, r := range refs {
		b.add(r)
	}
}

func (b *partBuilder) add(r sampleRef) {
	b.refs = append(b.refs, r)
	if r.resource != b.last.resource {
		srcRP := b.src.ResourceProfiles[r.resource]
		b.rp = &profilespb.ResourceProfiles{Resource: b.s.resource(srcRP.Resource), SchemaUrl: srcRP.SchemaUrl}
		b.part.ResourceProfiles = append(b.part.ResourceProfiles, b.rp)
		b.size += fieldSize(proto.Size(b.rp))
		b.last = sampleRef{r.resource, -1, -1, -1}
	}
	if r.scope < 0 {
		return
	}
	if r.scope != b.last.scope {
		srcSP := b.src.ResourceProfiles[r.resource].ScopeProfiles[r.scope]
		b.sp = &profilespb.ScopeProfiles{Scope: srcSP.Scope, SchemaUrl: srcSP.SchemaUrl}
		b.rp.ScopeProfiles = append(b.rp.ScopeProfiles, b.sp)
		b.size += fieldSize(proto.Size(b.sp))
		b.last.scope, b.last.profile = r.scope, -1
	}
	if r.profile < 0 {
		return
	}
	if r.profile != b.last.profile {
		b.srcProf = b.src.ResourceProfiles[r.resource].ScopeProfiles[r.scope].Profiles[r.profile]
		b.prof = b.s.profile(b.srcProf)
		b.sp.Profiles = append(b.sp.Profiles, b.prof)
		b.profiles = append(b.profiles, profileCopy{b.prof, b.srcProf})
		b.size += fieldSize(proto.Size(b.prof))
		b.last.profile = r.profile
	}
	if r.sample < 0 {
		return
	}
	x := b.s.sample(b.srcProf.Samples[r.sample])
	b.prof.Samples = append(b.prof.Samples, x)
	b.size += fieldSize(proto.Size(x))
}

// finish returns the part, halved again if the size estimate was off; a single
// sample stays whole whatever its size.
func (b *partBuilder) finish(maxBytes int) []*partBuilder {
	if len(b.refs) <= 1 || proto.Size(b.part) <= maxBytes {
		return []*partBuilder{b}
	}
	mid := len(b.refs) / 2
	return append(buildPart(b.src, b.refs[:mid]).finish(maxBytes), buildPart(b.src, b.refs[mid:]).finish(maxBytes)...)
}

// fieldSize is the size of a length-delimited field holding n bytes.
func fieldSize(n int) int { return 1 + protowire.SizeVarint(uint64(n)) + n }

// subsetter copies entries of a source dictionary into a new one on first use.
// Source tables are deduplicated, so distinct source indices stay distinct.
type subsetter struct {
	src, dst *profilespb.ProfilesDictionary
	// src index -> dst index; 0 means not copied yet (index 0 maps to 0 anyway).
	strs, attrs, mappings, locations, functions, links, stacks []int32
	// size, when set, grows by the marshalled size of each entry copied.
	size *int
}

// added accounts for an entry of n bytes appended to a dst table.
func (s *subsetter) added(n int) {
	if s.size != nil {
		*s.size += fieldSize(n)
	}
}

func newSubsetter(src *profilespb.ProfilesDictionary) *subsetter {
	if src == nil {
		src = &profilespb.ProfilesDictionary{}
	}
	return &subsetter{
		src: src,
		dst: &profilespb.ProfilesDictionary{
			MappingTable:   []*profilespb.Mapping{{}},
			LocationTable:  []*profilespb.Location{{}},
			FunctionTable:  []*profilespb.Function{{}},
			LinkTable:      []*profilespb.Link{zeroLink()},
			StringTable:    []string{""},
			AttributeTable: []*profilespb.KeyValueAndUnit{{}},
			StackTable:     []*profilespb.Stack{{}},
		},
		strs:      make([]int32, len(src.StringTable)),
		attrs:     make([]int32, len(src.AttributeTable)),
		mappings:  make([]int32, len(src.MappingTable)),
		locations: make([]int32, len(src.LocationTable)),
		functions: make([]int32, len(src.FunctionTable)),
		links:     make([]int32, len(src.LinkTable)),
		stacks:    make([]int32, len(src.StackTable)),
	}
}

// remap returns the dst index of src index i, copying the entry with add on first
// use. Out-of-range indices, which a valid request does not have, become 0.
func remap(seen []int32, i int32, add func() int32) int32 {
	if i <= 0 || int(i) >= len(seen) {
		return 0
	}
	if seen[i] == 0 {
		seen[i] = add()
	}
	return seen[i]
}

func (s *subsetter) str(i int32) int32 {
	return remap(s.strs, i, func() int32 {
		s.dst.StringTable = append(s.dst.StringTable, s.src.StringTable[i])
		s.added(len(s.src.StringTable[i]))
		return int32(len(s.dst.StringTable) - 1)
	})
}

func (s *subsetter) indices(idx []int32, f func(int32) int32) []int32 {
	if len(idx) == 0 {
		return nil
	}
	out := make([]int32, len(idx))
	for j, i := range idx {
		out[j] = f(i)
	}
	return out
}

func (s *subsetter) value(v *commonpb.AnyValue) *commonpb.AnyValue {
	if sv, ok := v.GetValue().(*commonpb.AnyValue_StringValueStrindex); ok {
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValueStrindex{StringValueStrindex: s.str(sv.StringValueStrindex)}}
	}
	return v // read-only from here on: sharing it is safe
}

func (s *subsetter) attr(i int32) int32 {
	return remap(s.attrs, i, func() int32 {
		a := s.src.AttributeTable[i]
		s.dst.AttributeTable = append(s.dst.AttributeTable, &profilespb.KeyValueAndUnit{
			KeyStrindex:  s.str(a.KeyStrindex),
			Value:        s.value(a.Value),
			UnitStrindex: s.str(a.UnitStrindex),
		})
		s.added(proto.Size(s.dst.AttributeTable[len(s.dst.AttributeTable)-1]))
		return int32(len(s.dst.AttributeTable) - 1)
	})
}

func (s *subsetter) mapping(i int32) int32 {
	return remap(s.mappings, i, func() int32 {
		m := s.src.MappingTable[i]
		s.dst.MappingTable = append(s.dst.MappingTable, &profilespb.Mapping{
			MemoryStart:      m.MemoryStart,
			MemoryLimit:      m.MemoryLimit,
			FileOffset:       m.FileOffset,
			FilenameStrindex: s.str(m.FilenameStrindex),
			AttributeIndices: s.indices(m.AttributeIndices, s.attr),
		})
		s.added(proto.Size(s.dst.MappingTable[len(s.dst.MappingTable)-1]))
		return int32(len(s.dst.MappingTable) - 1)
	})
}

func (s *subsetter) function(i int32) int32 {
	return remap(s.functions, i, func() int32 {
		f := s.src.FunctionTable[i]
		s.dst.FunctionTable = append(s.dst.FunctionTable, &profilespb.Function{
			NameStrindex:       s.str(f.NameStrindex),
			SystemNameStrindex: s.str(f.SystemNameStrindex),
			FilenameStrindex:   s.str(f.FilenameStrindex),
			StartLine:          f.StartLine,
		})
		s.added(proto.Size(s.dst.FunctionTable[len(s.dst.FunctionTable)-1]))
		return int32(len(s.dst.FunctionTable) - 1)
	})
}

func (s *subsetter) location(i int32) int32 {
	return remap(s.locations, i, func() int32 {
		l := s.src.LocationTable[i]
		nl := &profilespb.Location{
			MappingIndex:     s.mapping(l.MappingIndex),
			Address:          l.Address,
			AttributeIndices: s.indices(l.AttributeIndices, s.attr),
		}
		for _, ln := range l.Lines {
			nl.Lines = append(nl.Lines, &profilespb.Line{FunctionIndex: s.function(ln.FunctionIndex), Line: ln.Line, Column: ln.Column})
		}
		s.dst.LocationTable = append(s.dst.LocationTable, nl)
		s.added(proto.Size(s.dst.LocationTable[len(s.dst.LocationTable)-1]))
		return int32(len(s.dst.LocationTable) - 1)
	})
}

func (s *subsetter) stack(i int32) int32 {
	return remap(s.stacks, i, func() int32 {
		st := s.src.StackTable[i]
		s.dst.StackTable = append(s.dst.StackTable, &profilespb.Stack{LocationIndices: s.indices(st.LocationIndices, s.location)})
		s.added(proto.Size(s.dst.StackTable[len(s.dst.StackTable)-1]))
		return int32(len(s.dst.StackTable) - 1)
	})
}

func (s *subsetter) link(i int32) int32 {
	return remap(s.links, i, func() int32 {
		l := s.src.LinkTable[i]
		s.dst.LinkTable = append(s.dst.LinkTable, &profilespb.Link{TraceId: l.TraceId, SpanId: l.SpanId})
		s.added(proto.Size(s.dst.LinkTable[len(s.dst.LinkTable)-1]))
		return int32(len(s.dst.LinkTable) - 1)
	})
}

func (s *subsetter) valueType(v *profilespb.ValueType) *profilespb.ValueType {
	if v == nil {
		return nil
	}
	return &profilespb.ValueType{TypeStrindex: s.str(v.TypeStrindex), UnitStrindex: s.str(v.UnitStrindex)}
}

func (s *subsetter) resource(r *resourcepb.Resource) *resourcepb.Resource {
	if r == nil {
		return nil
	}
	plain := true
	for _, kv := range r.Attributes {
		if kv.KeyStrindex != 0 {
			plain = false
			break
		}
	}
	if plain {
		return r // sonde's resources use plain keys: nothing to remap, share it
	}
	c := proto.Clone(r).(*resourcepb.Resource)
	for _, kv := range c.Attributes {
		kv.KeyStrindex = s.str(kv.KeyStrindex)
		kv.Value = s.value(kv.Value)
	}
	return c
}

// profile copies p's header.
func (s *subsetter) profile(p *profilespb.Profile) *profilespb.Profile {
	np := &profilespb.Profile{
		SampleType:             s.valueType(p.SampleType),
		TimeUnixNano:           p.TimeUnixNano,
		DurationNano:           p.DurationNano,
		PeriodType:             s.valueType(p.PeriodType),
		Period:                 p.Period,
		DroppedAttributesCount: p.DroppedAttributesCount,
		AttributeIndices:       s.indices(p.AttributeIndices, s.attr),
		ProfileId:              p.ProfileId,
		OriginalPayloadFormat:  p.OriginalPayloadFormat,
		OriginalPayload:        p.OriginalPayload,
	}
	return np
}

func (s *subsetter) sample(x *profilespb.Sample) *profilespb.Sample {
	return &profilespb.Sample{
		StackIndex:         s.stack(x.StackIndex),
		AttributeIndices:   s.indices(x.AttributeIndices, s.attr),
		LinkIndex:          s.link(x.LinkIndex),
		Values:             x.Values,
		TimestampsUnixNano: x.TimestampsUnixNano,
	}
}
