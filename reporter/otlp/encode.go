package otlp

import (
	"crypto/rand"
	"encoding/binary"
	"io"
	"path/filepath"
	"slices"
	"strings"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/profiles/v1development"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"

	"github.com/sonde-profiler/sonde/trace"
)

// ScopeName is the instrumentation scope of every profile sonde sends.
const ScopeName = "sonde"

// Attribute keys, from the OpenTelemetry semantic conventions.
const (
	keyHostName       = "host.name"
	keyHostID         = "host.id"
	keyOSType         = "os.type"
	keyProcessPID     = "process.pid"
	keyExecutableName = "process.executable.name"
	keyExecutablePath = "process.executable.path"
	keyContainerID    = "container.id"
	keyPodUID         = "k8s.pod.uid"
	keyServiceName    = "service.name"
	keyThreadName     = "thread.name"
	keyThreadID       = "thread.id"
	keyFrameType      = "profile.frame.type"
	// keySymbolSource says where a frame's name came from (symtab, dynsym, dwarf,
	// gopclntab, kallsyms, none), so users can see why a frame is unnamed.
	keySymbolSource   = "sonde.frame.symbol_source"
	keyBuildIDGNU     = "process.executable.build_id.gnu"
	keyBuildIDGo      = "process.executable.build_id.go"
	keyBuildIDHTLHash = "process.executable.build_id.htlhash"
)

// EncodeOptions tune Encode.
type EncodeOptions struct {
	// Version is sonde's version, sent as the instrumentation scope's version.
	Version string
	// Timestamps sends when each sample was taken, not just how many there were.
	Timestamps bool
	// Rand supplies profile IDs; crypto/rand when nil. Tests set it to get
	// reproducible requests.
	Rand io.Reader
	// ThreadAttributes chooses the per-sample thread attributes; zero sends both name
	// and id. A backend that turns sample attributes into series labels (Pyroscope) makes
	// one series per value: thread.id alone can multiply a service's series by its threads.
	ThreadAttributes ThreadAttributes
}

// ThreadAttributes is a set of per-sample thread attributes.
type ThreadAttributes uint8

const (
	ThreadName ThreadAttributes = 1 << iota // thread.name
	ThreadID                                // thread.id
	// ThreadNone sends neither.
	ThreadNone ThreadAttributes = 1 << 7
)

// Encode turns profiles, usually one per interval, into a request: one
// ResourceProfiles per process, holding one Profile per interval the process was
// sampled in, all indexing one deduplicated dictionary.
//
// Locations carry the runtime address, inside [memory_start, memory_limit) of their
// mapping as the data model asks, so the file offset a backend symbolizes by build ID
// is address - memory_start + file_offset.
//
// Samples with timestamps, when opts.Timestamps is set and the sample has one per
// count, are sent as timestamps only (each standing for a value of 1): the profiles
// proto requires values and timestamps to be equally long when both are present.
// Other samples carry their count as their single value.
func Encode(profiles []*trace.Profile, host Resource, opts EncodeOptions) *collectorpb.ExportProfilesServiceRequest {
	e := newEncoder(host, opts)
	e.reserve(profiles)
	for _, p := range profiles {
		if p != nil {
			e.addProfile(p)
		}
	}
	return e.req
}

// reserve sizes the tables for the profiles up front: grown from empty, their maps would
// rehash a dozen times on a busy host's interval.
func (e *encoder) reserve(profiles []*trace.Profile) {
	var locs, samples int
	for _, p := range profiles {
		if p != nil {
			locs += len(p.Locations)
			samples += len(p.Samples)
		}
	}
	e.samples = make(map[sampleKey]*profilespb.Sample, samples)
	e.chunkStacks = make(map[string]int32, samples)
	e.chunkIDs = make(map[**trace.Location]int32, locs/4)
	d := e.d
	d.locationPtrs = make(map[*trace.Location]int32, locs)
	d.locations = make(map[locationKey]int32, locs)
	d.locations[locationKey{}] = 0
	d.stacks = make(map[string]int32, samples)
	d.stacks[""] = 0
	d.dict.LocationTable = slices.Grow(d.dict.LocationTable, locs)
	d.dict.StackTable = slices.Grow(d.dict.StackTable, samples)
}

type encoder struct {
	opts      EncodeOptions
	rand      io.Reader
	hostAttrs []*commonpb.KeyValue
	req       *collectorpb.ExportProfilesServiceRequest
	d         *dictBuilder
	scope     *commonpb.InstrumentationScope
	// scopes holds each process's single ScopeProfiles, keyed by value because
	// successive intervals describe the same process with different pointers.
	scopes map[processKey]*profilespb.ScopeProfiles
	// threadAttrs caches the attribute_indices of a thread; samples share the slices.
	threadAttrs map[threadKey][]int32

	samples   map[sampleKey]*profilespb.Sample
	stackBuf  []byte
	stackKey  []byte
	stackLocs []int32
	// Per-chunk work for samples that come in chunks: ids by the chunk's shared slice,
	// each chunk's location indices, and stacks keyed by their chunk ids.
	chunkIDs    map[**trace.Location]int32
	chunkLocs   [][]int32
	chunkStacks map[string]int32
	sampleType  *profilespb.ValueType
	periodType  *profilespb.ValueType
	offType     *profilespb.ValueType
	// Scratch for contextAttributes.
	ctxIdx   []int32
	attrsBuf []byte
	attrsKey string
}

type threadKey struct {
	tid  uint32
	name string
}

// sampleKey is a sample's identity in the profiles data model: samples that share it
// are merged.
type sampleKey struct {
	profile *profilespb.Profile
	stack   int32
	thread  threadKey
	// timestamped samples cannot merge with counted ones: their shapes differ.
	timestamped bool
	// link and attrs (the context's attribute indices, 4 bytes each) keep samples of
	// different spans apart.
	link  int32
	attrs string
}

// OffCPUType is the sample type of off-CPU profiles, in nanoseconds.
const OffCPUType = "off_cpu"

func newEncoder(host Resource, opts EncodeOptions) *encoder {
	e := &encoder{
		opts:        opts,
		rand:        opts.Rand,
		d:           newDictBuilder(),
		scope:       &commonpb.InstrumentationScope{Name: ScopeName, Version: opts.Version},
		scopes:      make(map[processKey]*profilespb.ScopeProfiles),
		threadAttrs: make(map[threadKey][]int32),
		samples:     make(map[sampleKey]*profilespb.Sample),
		chunkIDs:    make(map[**trace.Location]int32),
		chunkStacks: make(map[string]int32),
	}
	if e.rand == nil {
		e.rand = rand.Reader
	}
	e.req = &collectorpb.ExportProfilesServiceRequest{Dictionary: e.d.dict}
	e.hostAttrs = hostAttributes(host)
	e.sampleType = &profilespb.ValueType{TypeStrindex: e.d.str("samples"), UnitStrindex: e.d.str("count")}
	e.periodType = &profilespb.ValueType{TypeStrindex: e.d.str("cpu"), UnitStrindex: e.d.str("nanoseconds")}
	return e
}

func hostAttributes(host Resource) []*commonpb.KeyValue {
	var kvs []*commonpb.KeyValue
	if host.HostName != "" {
		kvs = setString(kvs, keyHostName, host.HostName)
	}
	if host.HostID != "" {
		kvs = setString(kvs, keyHostID, host.HostID)
	}
	kvs = setString(kvs, keyOSType, "linux")
	for _, k := range sortedKeys(host.Attributes) {
		kvs = setString(kvs, k, host.Attributes[k])
	}
	return kvs
}

// setString sets key in a resource's attributes, replacing an earlier value: keys
// must be unique there.
func setString(kvs []*commonpb.KeyValue, key, value string) []*commonpb.KeyValue {
	return setValue(kvs, validUTF8(key), &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: validUTF8(value)}})
}

// validUTF8 replaces what is not UTF-8 in a string a process or a file supplied (a thread
// name set with prctl, a path, a symbol): protobuf refuses to marshal a string field that
// is not UTF-8, and one such name would cost the whole request.
func validUTF8(s string) string {
	return strings.ToValidUTF8(s, "\uFFFD")
}

func setValue(kvs []*commonpb.KeyValue, key string, v *commonpb.AnyValue) []*commonpb.KeyValue {
	for _, kv := range kvs {
		if kv.Key == key {
			kv.Value = v
			return kvs
		}
	}
	return append(kvs, &commonpb.KeyValue{Key: key, Value: v})
}

// processKey is a process's identity in a request: what its resource says.
type processKey struct {
	pid                                      uint32
	name, exe, container, pod, cgroup, attrs string
	known                                    bool
}

func keyOf(p *trace.Process) processKey {
	if p == nil {
		return processKey{}
	}
	k := processKey{pid: p.PID, name: p.Name, exe: p.ExePath, container: p.ContainerID, pod: p.PodUID, cgroup: p.Cgroup, known: true}
	if len(p.Attributes) > 0 || len(p.Published) > 0 {
		var b strings.Builder
		for _, m := range [...]map[string]string{p.Published, p.Attributes} {
			for _, key := range sortedKeys(m) {
				b.WriteString(key)
				b.WriteByte(0)
				b.WriteString(m[key])
				b.WriteByte(0)
			}
			b.WriteByte(1)
		}
		k.attrs = b.String()
	}
	return k
}

func (e *encoder) addProfile(p *trace.Profile) {
	// One Profile per process in this interval, and a second one beside it for the time
	// its threads waited off the CPU, in the same dictionary.
	profiles := make(map[*trace.Process]*profilespb.Profile)
	var offProfiles map[*trace.Process]*profilespb.Profile
	// Slabs: one allocation for all the samples and values of the interval.
	sampleSlab := make([]profilespb.Sample, len(p.Samples))
	valueSlab := make([]int64, len(p.Samples))
	var offValues []int64
	var offSlab []profilespb.Sample
	for i, s := range p.Samples {
		if s.Count > 0 || s.OffCPU <= 0 {
			prof := profiles[s.Process]
			if prof == nil {
				prof = e.newProfile(s.Process, p, false)
				profiles[s.Process] = prof
			}
			e.addSample(prof, s, &sampleSlab[i], valueSlab[i:i+1:i+1], s.Count, true)
		}
		if s.OffCPU > 0 {
			if offProfiles == nil {
				offProfiles = make(map[*trace.Process]*profilespb.Profile)
				offSlab = make([]profilespb.Sample, len(p.Samples))
				offValues = make([]int64, len(p.Samples))
			}
			prof := offProfiles[s.Process]
			if prof == nil {
				prof = e.newProfile(s.Process, p, true)
				offProfiles[s.Process] = prof
			}
			e.addSample(prof, s, &offSlab[i], offValues[i:i+1:i+1], s.OffCPU, false)
		}
	}
}

// newProfile starts a process's CPU profile of the interval, or with off its off-CPU one.
func (e *encoder) newProfile(proc *trace.Process, p *trace.Profile, off bool) *profilespb.Profile {
	key := keyOf(proc)
	sp := e.scopes[key]
	if sp == nil {
		sp = &profilespb.ScopeProfiles{Scope: e.scope}
		e.scopes[key] = sp
		e.req.ResourceProfiles = append(e.req.ResourceProfiles, &profilespb.ResourceProfiles{
			Resource:      &resourcepb.Resource{Attributes: e.processAttributes(proc)},
			ScopeProfiles: []*profilespb.ScopeProfiles{sp},
		})
	}
	prof := &profilespb.Profile{
		SampleType: e.sampleType,
		PeriodType: e.periodType,
		Period:     p.Period.Nanoseconds(),
		ProfileId:  newProfileID(e.rand),
	}
	if off {
		if e.offType == nil {
			e.offType = &profilespb.ValueType{TypeStrindex: e.d.str(OffCPUType), UnitStrindex: e.d.str("nanoseconds")}
		}
		// Values are the nanoseconds waited; every wait is recorded (past a minimum), not
		// sampled on a period.
		prof.SampleType, prof.PeriodType, prof.Period = e.offType, e.offType, 1
	}
	if !p.Start.IsZero() {
		prof.TimeUnixNano = uint64(p.Start.UnixNano())
		if d := p.End.Sub(p.Start); d > 0 {
			prof.DurationNano = uint64(d)
		}
	}
	sp.Profiles = append(sp.Profiles, prof)
	return prof
}

// processAttributes is the resource of a process: the host's attributes, then the
// process's own, which win, then what it published in its process context, then what a
// Describer added (service.name, k8s.*), which wins over all. Every resource carries service.name: the process's, else the executable's
// name, which the host's OTEL_SERVICE_NAME, naming sonde, must not replace.
func (e *encoder) processAttributes(proc *trace.Process) []*commonpb.KeyValue {
	kvs := make([]*commonpb.KeyValue, 0, len(e.hostAttrs)+4)
	for _, kv := range e.hostAttrs {
		kvs = append(kvs, &commonpb.KeyValue{Key: kv.Key, Value: kv.Value})
	}
	if proc == nil {
		return kvs
	}
	kvs = setValue(kvs, keyProcessPID, &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: int64(proc.PID)}})
	name := proc.Name
	if name == "" && proc.ExePath != "" {
		name = filepath.Base(proc.ExePath)
	}
	if name != "" {
		kvs = setString(kvs, keyExecutableName, name)
	}
	if proc.ExePath != "" {
		kvs = setString(kvs, keyExecutablePath, proc.ExePath)
	}
	if proc.ContainerID != "" {
		kvs = setString(kvs, keyContainerID, proc.ContainerID)
	}
	if proc.PodUID != "" {
		kvs = setString(kvs, keyPodUID, proc.PodUID)
	}
	// What the process published of itself (OTEP 4719) describes it better than what
	// sonde could see from outside; a Describer's attributes still win.
	for _, k := range sortedKeys(proc.Published) {
		kvs = setString(kvs, k, proc.Published[k])
	}
	for _, k := range sortedKeys(proc.Attributes) {
		kvs = setString(kvs, k, proc.Attributes[k])
	}
	if _, ok := proc.Attributes[keyServiceName]; !ok {
		service := cmpOr(cmpOr(proc.Published[keyServiceName], proc.EnvServiceName), name)
		if service == "" {
			service = "unknown_service"
		}
		kvs = setString(kvs, keyServiceName, service)
	}
	return kvs
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// addSample adds v to the sample of s's stack, thread and context in prof; with
// timestamps, a CPU sample sends its samples' times instead where the options ask.
func (e *encoder) addSample(prof *profilespb.Profile, s *trace.Sample, slot *profilespb.Sample, value []int64, v int64, timestamps bool) {
	stack := e.stackOf(s)
	thread := threadKey{tid: s.TID, name: s.ThreadName}
	timestamped := timestamps && e.opts.Timestamps && s.Count > 0 && len(s.Timestamps) == int(s.Count)
	key := sampleKey{profile: prof, stack: stack, thread: thread, timestamped: timestamped, link: e.d.link(s.Link)}
	var ctxAttrs []int32
	if len(s.Attributes) > 0 {
		ctxAttrs = e.contextAttributes(s.Attributes)
		key.attrs = e.attrsKey
	}
	ps := e.samples[key]
	if ps == nil {
		ps = slot
		ps.StackIndex = stack
		ps.LinkIndex = key.link
		ps.AttributeIndices = e.threadAttributes(thread)
		if len(ctxAttrs) > 0 {
			ps.AttributeIndices = append(slices.Clip(ps.AttributeIndices), ctxAttrs...)
		}
		if !timestamped {
			ps.Values = value
		}
		e.samples[key] = ps
		prof.Samples = append(prof.Samples, ps)
	}
	if timestamped {
		for _, t := range s.Timestamps {
			ps.TimestampsUnixNano = append(ps.TimestampsUnixNano, uint64(t.UnixNano()))
		}
	} else {
		ps.Values[0] += v
	}
}

// contextAttributes returns the attribute indices of a sample's trace context attributes,
// and leaves their key in e.attrsKey.
func (e *encoder) contextAttributes(attrs []trace.Attribute) []int32 {
	idx := e.ctxIdx[:0]
	key := e.attrsBuf[:0]
	for _, a := range attrs {
		i := e.d.attrString(a.Key, a.Value)
		idx = append(idx, i)
		key = binary.LittleEndian.AppendUint32(key, uint32(i))
	}
	e.ctxIdx, e.attrsBuf = idx, key
	e.attrsKey = string(key)
	return idx
}

func (e *encoder) threadAttributes(t threadKey) []int32 {
	if idx, ok := e.threadAttrs[t]; ok {
		return idx
	}
	which := e.opts.ThreadAttributes
	if which == 0 {
		which = ThreadName | ThreadID
	}
	idx := make([]int32, 0, 2)
	if t.name != "" && which&ThreadName != 0 {
		idx = append(idx, e.d.attrString(keyThreadName, t.name))
	}
	if which&ThreadID != 0 {
		idx = append(idx, e.d.attrInt(keyThreadID, int64(t.tid)))
	}
	e.threadAttrs[t] = idx
	return idx
}

// stackOf returns the sample's stack_table index. Samples from the collector come cut into
// interned chunks: then the location indices are worked out once per chunk, and a stack is
// looked up by its chunks, a few per stack, rather than by every frame. The stack table
// itself still lists every frame of each distinct stack: that is the wire format.
func (e *encoder) stackOf(s *trace.Sample) int32 {
	if len(s.Chunks) == 0 {
		return e.stack(s.Locations)
	}
	key := e.stackBuf[:0]
	for _, ch := range s.Chunks {
		if len(ch) == 0 {
			continue
		}
		key = binary.LittleEndian.AppendUint32(key, uint32(e.chunkID(ch)))
	}
	e.stackBuf = key
	if si, ok := e.chunkStacks[string(key)]; ok {
		return si
	}
	idx := e.stackLocs[:0]
	for _, ch := range s.Chunks {
		if len(ch) > 0 {
			idx = append(idx, e.chunkLocs[e.chunkIDs[&ch[0]]]...)
		}
	}
	e.stackLocs = idx
	si := e.stack(nil, idx...)
	e.chunkStacks[string(key)] = si
	return si
}

// chunkID numbers a chunk (a location slice shared by the samples that contain it) and
// works out its location indices on first sight.
func (e *encoder) chunkID(ch []*trace.Location) int32 {
	if id, ok := e.chunkIDs[&ch[0]]; ok {
		return id
	}
	id := int32(len(e.chunkLocs))
	locs := make([]int32, len(ch))
	for i, l := range ch {
		locs[i] = e.d.location(l)
	}
	e.chunkLocs = append(e.chunkLocs, locs)
	e.chunkIDs[&ch[0]] = id
	return id
}

// stack returns the stack_table index of locs, or of the location indices idx when locs
// is nil.
func (e *encoder) stack(locs []*trace.Location, idx ...int32) int32 {
	if locs != nil {
		idx = e.stackLocs[:0]
		for _, l := range locs {
			idx = append(idx, e.d.location(l))
		}
		e.stackLocs = idx
	}
	buf := e.stackKey[:0]
	for _, li := range idx {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(li))
	}
	e.stackKey = buf
	if si, ok := e.d.stacks[string(buf)]; ok {
		return si
	}
	si := int32(len(e.d.dict.StackTable))
	e.d.dict.StackTable = append(e.d.dict.StackTable, &profilespb.Stack{LocationIndices: append([]int32(nil), idx...)})
	e.d.stacks[string(buf)] = si
	return si
}

// newProfileID returns 16 random bytes, never all zero: that ID is invalid.
func newProfileID(r io.Reader) []byte {
	id := make([]byte, 16)
	if _, err := io.ReadFull(r, id); err != nil {
		// A profile ID is optional; a missing one beats a failed export.
		return nil
	}
	for _, b := range id {
		if b != 0 {
			return id
		}
	}
	id[15] = 1
	return id
}

// dictBuilder builds a ProfilesDictionary whose tables hold each value once, the
// zero value first.
type dictBuilder struct {
	dict *profilespb.ProfilesDictionary

	strings   map[string]int32
	functions map[functionKey]int32
	mappings  map[mappingKey]int32
	locations map[locationKey]int32
	stacks    map[string]int32 // key: the location indices, 4 bytes each
	attrs     map[attrKey]int32

	// Pointer caches: a profile's samples share *trace.Location and *trace.Mapping
	// values, so most look-ups skip building a value key.
	mappingPtrs  map[*trace.Mapping]int32
	locationPtrs map[*trace.Location]int32

	// links indexes link_table: a link per span samples were taken in.
	links map[trace.Link]int32

	lineBuf []byte
	// kinds holds one attribute_indices slice per frame type and name source, shared by locations.
	kinds map[[2]int32][]int32
}

type functionKey struct{ name, systemName, file int32 }

type mappingKey struct {
	start, limit, offset uint64
	file                 int32
	gnu, goID, htl       int32
}

type locationKey struct {
	mapping int32
	address uint64
	kind    int32
	source  int32
	lines   string // function index and line of each line, packed
}

type attrKey struct {
	key   int32
	isInt bool
	str   string
	num   int64
}

func newDictBuilder() *dictBuilder {
	return &dictBuilder{
		dict: &profilespb.ProfilesDictionary{
			MappingTable:   []*profilespb.Mapping{{}},
			LocationTable:  []*profilespb.Location{{}},
			FunctionTable:  []*profilespb.Function{{}},
			LinkTable:      []*profilespb.Link{zeroLink()},
			StringTable:    []string{""},
			AttributeTable: []*profilespb.KeyValueAndUnit{{}},
			StackTable:     []*profilespb.Stack{{}},
		},
		strings:      map[string]int32{"": 0},
		functions:    map[functionKey]int32{{}: 0},
		mappings:     map[mappingKey]int32{{}: 0},
		locations:    map[locationKey]int32{{}: 0},
		stacks:       map[string]int32{"": 0},
		attrs:        make(map[attrKey]int32),
		mappingPtrs:  make(map[*trace.Mapping]int32),
		locationPtrs: make(map[*trace.Location]int32),
		kinds:        make(map[[2]int32][]int32),
		links:        map[trace.Link]int32{{}: 0},
	}
}

// link returns the link_table index of a span; the zero link is entry 0.
func (d *dictBuilder) link(l trace.Link) int32 {
	if i, ok := d.links[l]; ok {
		return i
	}
	i := int32(len(d.dict.LinkTable))
	d.dict.LinkTable = append(d.dict.LinkTable, &profilespb.Link{TraceId: slices.Clone(l.TraceID[:]), SpanId: slices.Clone(l.SpanID[:])})
	d.links[l] = i
	return i
}

// zeroLink is link_table[0]. The proto recommends full-length zero IDs over empty
// ones for decoders that insist on 16- and 8-byte IDs.
func zeroLink() *profilespb.Link {
	return &profilespb.Link{TraceId: make([]byte, 16), SpanId: make([]byte, 8)}
}

func (d *dictBuilder) str(s string) int32 {
	if i, ok := d.strings[s]; ok {
		return i
	}
	s = validUTF8(s)
	if i, ok := d.strings[s]; ok {
		return i
	}
	i := int32(len(d.dict.StringTable))
	d.dict.StringTable = append(d.dict.StringTable, s)
	d.strings[s] = i
	return i
}

func (d *dictBuilder) attrString(key, value string) int32 {
	k := attrKey{key: d.str(key), str: validUTF8(value)}
	if i, ok := d.attrs[k]; ok {
		return i
	}
	return d.addAttr(k, &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: k.str}})
}

func (d *dictBuilder) attrInt(key string, value int64) int32 {
	k := attrKey{key: d.str(key), isInt: true, num: value}
	if i, ok := d.attrs[k]; ok {
		return i
	}
	return d.addAttr(k, &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: value}})
}

func (d *dictBuilder) addAttr(k attrKey, v *commonpb.AnyValue) int32 {
	i := int32(len(d.dict.AttributeTable))
	d.dict.AttributeTable = append(d.dict.AttributeTable, &profilespb.KeyValueAndUnit{KeyStrindex: k.key, Value: v})
	d.attrs[k] = i
	return i
}

func (d *dictBuilder) function(name, systemName, file string) int32 {
	k := functionKey{name: d.str(name), systemName: d.str(systemName), file: d.str(file)}
	if i, ok := d.functions[k]; ok {
		return i
	}
	i := int32(len(d.dict.FunctionTable))
	d.dict.FunctionTable = append(d.dict.FunctionTable, &profilespb.Function{
		NameStrindex:       k.name,
		SystemNameStrindex: k.systemName,
		FilenameStrindex:   k.file,
	})
	d.functions[k] = i
	return i
}

func (d *dictBuilder) mapping(m *trace.Mapping) int32 {
	if m == nil {
		return 0
	}
	if i, ok := d.mappingPtrs[m]; ok {
		return i
	}
	path := m.Path
	if path == "" && m.File != nil {
		path = m.File.Path
	}
	k := mappingKey{start: m.Start, limit: m.End, offset: m.Offset, file: d.str(path)}
	if f := m.File; f != nil {
		if f.GNUBuildID != "" {
			k.gnu = d.attrString(keyBuildIDGNU, f.GNUBuildID)
		}
		if f.GoBuildID != "" {
			k.goID = d.attrString(keyBuildIDGo, f.GoBuildID)
		}
		if f.HTLHash != "" {
			k.htl = d.attrString(keyBuildIDHTLHash, f.HTLHash)
		}
	}
	i, ok := d.mappings[k]
	if !ok {
		i = int32(len(d.dict.MappingTable))
		pm := &profilespb.Mapping{
			MemoryStart:      k.start,
			MemoryLimit:      k.limit,
			FileOffset:       k.offset,
			FilenameStrindex: k.file,
		}
		for _, a := range [...]int32{k.gnu, k.goID, k.htl} {
			if a != 0 {
				pm.AttributeIndices = append(pm.AttributeIndices, a)
			}
		}
		d.dict.MappingTable = append(d.dict.MappingTable, pm)
		d.mappings[k] = i
	}
	d.mappingPtrs[m] = i
	return i
}

func (d *dictBuilder) kindAttrs(kind, source int32) []int32 {
	if kind == 0 && source == 0 {
		return nil
	}
	s, ok := d.kinds[[2]int32{kind, source}]
	if !ok {
		for _, a := range [...]int32{kind, source} {
			if a != 0 {
				s = append(s, a)
			}
		}
		d.kinds[[2]int32{kind, source}] = s
	}
	return s
}

func (d *dictBuilder) location(l *trace.Location) int32 {
	if l == nil {
		return 0
	}
	if i, ok := d.locationPtrs[l]; ok {
		return i
	}
	k := locationKey{mapping: d.mapping(l.Mapping), address: l.Address}
	switch l.Kind {
	case trace.FrameNative, trace.FrameKernel, trace.FrameGo, trace.FrameInterp:
		k.kind = d.attrString(keyFrameType, l.KindName())
	}
	if l.NameSource != "" {
		k.source = d.attrString(keySymbolSource, l.NameSource)
	}
	buf := d.lineBuf[:0]
	for _, ln := range l.Lines {
		fi := d.function(ln.Function, ln.SystemName, ln.File)
		buf = binary.LittleEndian.AppendUint32(buf, uint32(fi))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(ln.Line))
	}
	d.lineBuf = buf
	i, ok := d.locations[locationKey{k.mapping, k.address, k.kind, k.source, string(buf)}]
	if !ok {
		k.lines = string(buf)
		i = int32(len(d.dict.LocationTable))
		pl := &profilespb.Location{MappingIndex: k.mapping, Address: k.address, AttributeIndices: d.kindAttrs(k.kind, k.source)}
		if n := len(l.Lines); n > 0 {
			// One allocation for the lines, one for the pointers to them.
			slab := make([]profilespb.Line, n)
			pl.Lines = make([]*profilespb.Line, n)
			for j := range n {
				slab[j].FunctionIndex = int32(binary.LittleEndian.Uint32(buf[12*j:]))
				slab[j].Line = l.Lines[j].Line
				pl.Lines[j] = &slab[j]
			}
		}
		d.dict.LocationTable = append(d.dict.LocationTable, pl)
		d.locations[k] = i
	}
	d.locationPtrs[l] = i
	return i
}
