package otlp

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

// ReadFile reads a file WriteFile wrote, or one the collector's file exporter wrote, in
// any of the forms DecodeFile tells apart by content; the name must still end in
// ".otlp.pb" or ".otlp.json", as WriteFile's do.
func ReadFile(path string) ([]*trace.Profile, error) {
	if !strings.HasSuffix(path, ".otlp.pb") && !IsJSON(path) {
		return nil, fmt.Errorf("read %s: unknown format: the name must end in .otlp.pb or .otlp.json", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	profiles, err := DecodeFile(data)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return profiles, nil
}

// Decode turns OTLP profiles back into sonde's profiles: data is one binary
// ProfilesData, or with json set, one OTLP/JSON ProfilesData per line (IDs in hex).
//
// Encode sends one OTLP Profile per process and interval; Decode gathers the OTLP
// profiles that cover the same time span with the same period into one profile, so
// each interval comes back whole, and returns them in time order. Processes come from
// the resource attributes (process.pid, process.executable.name and .path,
// container.id), threads from the sample attributes (thread.id, thread.name), frame
// kinds and build IDs from the location and mapping attributes. Samples sent as
// timestamps count one per timestamp. Every table index is checked: a corrupt file is
// an error, never a panic.
func Decode(data []byte, json bool) ([]*trace.Profile, error) {
	d := newDecoder()
	if !json {
		var pd profilespb.ProfilesData
		if err := proto.Unmarshal(data, &pd); err != nil {
			return nil, fmt.Errorf("decode OTLP profiles: %w", err)
		}
		if err := d.add(&pd); err != nil {
			return nil, fmt.Errorf("decode OTLP profiles: %w", err)
		}
		return d.result(), nil
	}
	for i, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if err := d.addJSON(line); err != nil {
			return nil, fmt.Errorf("decode OTLP/JSON line %d: %w", i+1, err)
		}
	}
	return d.result(), nil
}

// addJSON adds one OTLP/JSON ProfilesData.
func (d *decoder) addJSON(b []byte) error {
	b, err := hexIDsToBase64(b)
	if err != nil {
		return err
	}
	var pd profilespb.ProfilesData
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &pd); err != nil {
		return err
	}
	return d.add(&pd)
}

// hexIDField matches the ID fields OTLP/JSON writes in hex, which protojson reads as
// base64. The base64 of an 8- or 16-byte ID always ends in '=', so an ID protojson
// wrote itself does not match and stays as it is.
var hexIDField = regexp.MustCompile(`"(profileId|traceId|spanId)":(\s*)"([0-9a-fA-F]*)"`)

func hexIDsToBase64(b []byte) ([]byte, error) {
	var convErr error
	b = hexIDField.ReplaceAllFunc(b, func(m []byte) []byte {
		sub := hexIDField.FindSubmatch(m)
		raw, err := hex.DecodeString(string(sub[3]))
		if err != nil {
			convErr = fmt.Errorf("%s: %w", sub[1], err)
			return m
		}
		return fmt.Appendf(nil, `"%s":%s"%s"`, sub[1], sub[2], base64.StdEncoding.EncodeToString(raw))
	})
	return b, convErr
}

type intervalKey struct {
	time, duration uint64
	period         int64
}

type decoder struct {
	byInterval map[intervalKey]*trace.Profile
	order      []*trace.Profile
	// listed holds, per profile, the locations it lists already.
	listed map[*trace.Profile]map[*trace.Location]bool
}

// interval returns the profile of an interval, made on first use. An interval's CPU and
// off-CPU profiles come apart, in either order, and go into one: the off-CPU one's key has
// no period.
func (d *decoder) interval(key intervalKey, off bool) *trace.Profile {
	p := d.byInterval[key]
	if p == nil {
		for k, q := range d.byInterval {
			if k.time == key.time && k.duration == key.duration && (off || k.period == 0) {
				p = q
				break
			}
		}
	}
	if p == nil {
		p = &trace.Profile{}
		if key.time != 0 {
			p.Start = time.Unix(0, int64(key.time))
			p.End = p.Start.Add(time.Duration(key.duration))
		}
		d.order = append(d.order, p)
		d.listed[p] = make(map[*trace.Location]bool)
	}
	if key.period > 0 && p.Period == 0 {
		p.Period = time.Duration(key.period)
	}
	d.byInterval[key] = p
	return p
}

func newDecoder() *decoder {
	return &decoder{byInterval: make(map[intervalKey]*trace.Profile)}
}

func (d *decoder) result() []*trace.Profile {
	out := slices.Clone(d.order)
	slices.SortStableFunc(out, func(a, b *trace.Profile) int { return a.Start.Compare(b.Start) })
	return out
}

// dict resolves one ProfilesData's dictionary indices, checking them.
type dict struct {
	d         *profilespb.ProfilesDictionary
	mappings  map[int32]*trace.Mapping
	locations map[int32]*trace.Location
}

// entry returns table[i]; index 0 of an empty table is the zero value the table's
// first entry stands for.
func entry[T any](table []T, i int32, what string) (T, error) {
	var zero T
	if i == 0 && len(table) == 0 {
		return zero, nil
	}
	if i < 0 || int(i) >= len(table) {
		return zero, fmt.Errorf("%s index %d outside its table of %d", what, i, len(table))
	}
	return table[i], nil
}

func (t *dict) str(i int32) (string, error) {
	return entry(t.d.GetStringTable(), i, "string")
}

// attr returns the key and value of attribute_table[i].
func (t *dict) attr(i int32) (string, *commonpb.AnyValue, error) {
	kv, err := entry(t.d.GetAttributeTable(), i, "attribute")
	if err != nil {
		return "", nil, err
	}
	key, err := t.str(kv.GetKeyStrindex())
	if err != nil {
		return "", nil, err
	}
	v, err := t.value(kv.GetValue())
	return key, v, err
}

// keyValue reads a resource attribute. The Collector writes what it received with the
// key and a string value moved into the string table (key_strindex,
// string_value_strindex), where sonde sends them inline.
func (t *dict) keyValue(kv *commonpb.KeyValue) (string, *commonpb.AnyValue, error) {
	key := kv.GetKey()
	if i := kv.GetKeyStrindex(); i != 0 {
		var err error
		if key, err = t.str(i); err != nil {
			return "", nil, fmt.Errorf("attribute key: %w", err)
		}
	}
	v, err := t.value(kv.GetValue())
	return key, v, err
}

// value returns v with a string from the string table in line, so that readers of
// string values need not know where it was.
func (t *dict) value(v *commonpb.AnyValue) (*commonpb.AnyValue, error) {
	x, ok := v.GetValue().(*commonpb.AnyValue_StringValueStrindex)
	if !ok {
		return v, nil
	}
	s, err := t.str(x.StringValueStrindex)
	if err != nil {
		return nil, fmt.Errorf("attribute value: %w", err)
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: s}}, nil
}

func (d *decoder) add(pd *profilespb.ProfilesData) error {
	if d.listed == nil {
		d.listed = make(map[*trace.Profile]map[*trace.Location]bool)
	}
	t := &dict{d: pd.GetDictionary(), mappings: make(map[int32]*trace.Mapping), locations: make(map[int32]*trace.Location)}
	for ri, rp := range pd.GetResourceProfiles() {
		proc, err := process(t, rp.GetResource().GetAttributes())
		if err != nil {
			return fmt.Errorf("resource %d: %w", ri, err)
		}
		for _, sp := range rp.GetScopeProfiles() {
			for pi, prof := range sp.GetProfiles() {
				if err := d.addProfile(t, proc, prof); err != nil {
					return fmt.Errorf("resource %d profile %d: %w", ri, pi, err)
				}
			}
		}
	}
	return nil
}

// process reads a resource's process attributes; nil when it names no process.
func process(t *dict, attrs []*commonpb.KeyValue) (*trace.Process, error) {
	var p trace.Process
	var known bool
	for _, kv := range attrs {
		key, v, err := t.keyValue(kv)
		if err != nil {
			return nil, err
		}
		switch key {
		case keyProcessPID:
			pid, err := intValue(v)
			if err != nil || pid < 0 || pid > 1<<32-1 {
				return nil, fmt.Errorf("%s %v is not a process ID", keyProcessPID, v)
			}
			p.PID, known = uint32(pid), true
		case keyExecutableName:
			p.Name, known = v.GetStringValue(), true
		case keyExecutablePath:
			p.ExePath, known = v.GetStringValue(), true
		case keyContainerID:
			p.ContainerID = v.GetStringValue()
		case keyPodUID:
			p.PodUID = v.GetStringValue()
		default:
			// What a describer added (service.name, k8s.*, a php-fpm worker's pool).
			if s, ok := v.GetValue().(*commonpb.AnyValue_StringValue); ok && !strings.HasPrefix(key, "host.") && key != keyOSType {
				if p.Attributes == nil {
					p.Attributes = map[string]string{}
				}
				p.Attributes[key] = s.StringValue
			}
		}
	}
	if !known {
		return nil, nil
	}
	return &p, nil
}

// intValue reads an integer attribute, also when a producer sent it as a string.
func intValue(v *commonpb.AnyValue) (int64, error) {
	if s, ok := v.GetValue().(*commonpb.AnyValue_StringValue); ok {
		return strconv.ParseInt(s.StringValue, 10, 64)
	}
	if _, ok := v.GetValue().(*commonpb.AnyValue_IntValue); !ok {
		return 0, fmt.Errorf("not an integer")
	}
	return v.GetIntValue(), nil
}

func (d *decoder) addProfile(t *dict, proc *trace.Process, prof *profilespb.Profile) error {
	var typ, unit string
	if st := prof.GetSampleType(); st != nil {
		var err error
		if typ, err = t.str(st.GetTypeStrindex()); err != nil {
			return fmt.Errorf("sample type: %w", err)
		}
		if unit, err = t.str(st.GetUnitStrindex()); err != nil {
			return fmt.Errorf("sample type: %w", err)
		}
	}
	off := typ == OffCPUType
	key := intervalKey{time: prof.GetTimeUnixNano(), duration: prof.GetDurationNano(), period: prof.GetPeriod()}
	if off {
		key.period = 0 // the interval's CPU profile has the period
	}
	p := d.interval(key, off)
	// A value in CPU time converts to samples by the period; sonde sends counts.
	divisor := int64(1)
	if unit == "nanoseconds" && key.period > 0 && !off {
		divisor = key.period
	}
	listed := d.listed[p]
	for si, ps := range prof.GetSamples() {
		s := &trace.Sample{Process: proc}
		switch {
		case off:
			if len(ps.GetValues()) > 0 {
				s.OffCPU = max(ps.GetValues()[0], 0)
			}
		case len(ps.GetValues()) > 0:
			s.Count = ps.GetValues()[0] / divisor
		default:
			s.Count = int64(len(ps.GetTimestampsUnixNano()))
		}
		for _, ts := range ps.GetTimestampsUnixNano() {
			s.Timestamps = append(s.Timestamps, time.Unix(0, int64(ts)))
		}
		if err := t.thread(s, ps.GetAttributeIndices()); err != nil {
			return fmt.Errorf("sample %d: %w", si, err)
		}
		stack, err := entry(t.d.GetStackTable(), ps.GetStackIndex(), "stack")
		if err != nil {
			return fmt.Errorf("sample %d: %w", si, err)
		}
		s.Locations = make([]*trace.Location, 0, len(stack.GetLocationIndices()))
		for _, li := range stack.GetLocationIndices() {
			l, err := t.location(li)
			if err != nil {
				return fmt.Errorf("sample %d: %w", si, err)
			}
			if !listed[l] {
				listed[l] = true
				p.Locations = append(p.Locations, l)
			}
			s.Locations = append(s.Locations, l)
		}
		p.Samples = append(p.Samples, s)
	}
	return nil
}

func (t *dict) thread(s *trace.Sample, attrs []int32) error {
	for _, ai := range attrs {
		key, v, err := t.attr(ai)
		if err != nil {
			return err
		}
		switch key {
		case keyThreadID:
			tid, err := intValue(v)
			if err != nil || tid < 0 || tid > 1<<32-1 {
				return fmt.Errorf("%s %v is not a thread ID", keyThreadID, v)
			}
			s.TID = uint32(tid)
		case keyThreadName:
			s.ThreadName = v.GetStringValue()
		}
	}
	return nil
}

func (t *dict) location(i int32) (*trace.Location, error) {
	if l, ok := t.locations[i]; ok {
		return l, nil
	}
	pl, err := entry(t.d.GetLocationTable(), i, "location")
	if err != nil {
		return nil, err
	}
	l := &trace.Location{Address: pl.GetAddress()}
	if mi := pl.GetMappingIndex(); mi != 0 {
		if l.Mapping, err = t.mapping(mi); err != nil {
			return nil, fmt.Errorf("location %d: %w", i, err)
		}
	}
	for _, ai := range pl.GetAttributeIndices() {
		key, v, err := t.attr(ai)
		if err != nil {
			return nil, fmt.Errorf("location %d: %w", i, err)
		}
		switch key {
		case keyFrameType:
			switch typ := v.GetStringValue(); typ {
			case "native":
				l.Kind = trace.FrameNative
			case "kernel":
				l.Kind = trace.FrameKernel
			case "go":
				l.Kind = trace.FrameGo
			case "":
			default:
				// Any other type is a language runtime's, whose frames keep its name.
				l.Kind = trace.FrameInterp
				l.Interp = &trace.InterpFrame{Type: typ, Code: l.Address}
			}
		case keySymbolSource:
			l.NameSource = v.GetStringValue()
		}
	}
	for _, ln := range pl.GetLines() {
		f, err := entry(t.d.GetFunctionTable(), ln.GetFunctionIndex(), "function")
		if err != nil {
			return nil, fmt.Errorf("location %d: %w", i, err)
		}
		var line trace.Line
		line.Line = ln.GetLine()
		if line.Function, err = t.str(f.GetNameStrindex()); err == nil {
			if line.SystemName, err = t.str(f.GetSystemNameStrindex()); err == nil {
				line.File, err = t.str(f.GetFilenameStrindex())
			}
		}
		if err != nil {
			return nil, fmt.Errorf("location %d function %d: %w", i, ln.GetFunctionIndex(), err)
		}
		l.Lines = append(l.Lines, line)
	}
	t.locations[i] = l
	return l, nil
}

func (t *dict) mapping(i int32) (*trace.Mapping, error) {
	if m, ok := t.mappings[i]; ok {
		return m, nil
	}
	pm, err := entry(t.d.GetMappingTable(), i, "mapping")
	if err != nil {
		return nil, err
	}
	m := &trace.Mapping{Start: pm.GetMemoryStart(), End: pm.GetMemoryLimit(), Offset: pm.GetFileOffset()}
	if m.Path, err = t.str(pm.GetFilenameStrindex()); err != nil {
		return nil, fmt.Errorf("mapping %d: %w", i, err)
	}
	f := new(objfile.File)
	for _, ai := range pm.GetAttributeIndices() {
		key, v, err := t.attr(ai)
		if err != nil {
			return nil, fmt.Errorf("mapping %d: %w", i, err)
		}
		switch key {
		case keyBuildIDGNU:
			f.GNUBuildID = v.GetStringValue()
		case keyBuildIDGo:
			f.GoBuildID = v.GetStringValue()
		case keyBuildIDHTLHash:
			f.HTLHash = v.GetStringValue()
		}
	}
	if f.GNUBuildID != "" || f.GoBuildID != "" || f.HTLHash != "" {
		f.Path = m.Path
		m.File = f
	}
	t.mappings[i] = m
	return m, nil
}
