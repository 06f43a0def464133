package otlp

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

func TestEncodeDictionary(t *testing.T) {
	f := newFixture()
	req := Encode([]*trace.Profile{f.profile}, testHost, EncodeOptions{Version: "1.2.3"})
	checkDictionary(t, req)
	d := req.Dictionary

	if got := len(req.ResourceProfiles); got != 2 {
		t.Fatalf("got %d resource profiles, want one per process (2)", got)
	}
	app, gosrv := req.ResourceProfiles[0], req.ResourceProfiles[1]
	for _, c := range []struct {
		rp   *profilespb.ResourceProfiles
		key  string
		want any
	}{
		{app, "process.pid", int64(100)},
		{app, "process.executable.name", "app"},
		{app, "process.executable.path", "/usr/bin/app"},
		{app, "host.name", "box"},
		{app, "host.id", "machine-1"},
		{app, "os.type", "linux"},
		{app, "deployment.environment", "test"},
		{gosrv, "process.pid", int64(200)},
		{gosrv, "container.id", "c0ffee"},
	} {
		got, ok := resourceAttr(c.rp, c.key)
		if !ok || got != c.want {
			t.Errorf("resource attribute %s = %v (present %v), want %v", c.key, got, ok, c.want)
		}
	}
	if _, ok := resourceAttr(app, "container.id"); ok {
		t.Errorf("container.id set for a process outside containers")
	}

	sp := app.ScopeProfiles
	if len(sp) != 1 || sp[0].Scope.GetName() != "sonde" || sp[0].Scope.GetVersion() != "1.2.3" {
		t.Fatalf("scope = %v, want one scope sonde 1.2.3", sp)
	}
	if len(sp[0].Profiles) != 1 {
		t.Fatalf("got %d profiles for one interval", len(sp[0].Profiles))
	}
	p := sp[0].Profiles[0]
	str := func(i int32) string { return d.StringTable[i] }
	if str(p.SampleType.TypeStrindex) != "samples" || str(p.SampleType.UnitStrindex) != "count" {
		t.Errorf("sample type = %s/%s", str(p.SampleType.TypeStrindex), str(p.SampleType.UnitStrindex))
	}
	if str(p.PeriodType.TypeStrindex) != "cpu" || str(p.PeriodType.UnitStrindex) != "nanoseconds" {
		t.Errorf("period type = %s/%s", str(p.PeriodType.TypeStrindex), str(p.PeriodType.UnitStrindex))
	}
	if p.Period != int64(10*time.Millisecond) || p.TimeUnixNano != uint64(t0.UnixNano()) || p.DurationNano != uint64(10*time.Second) {
		t.Errorf("period %d time %d duration %d", p.Period, p.TimeUnixNano, p.DurationNano)
	}
	if len(p.ProfileId) != 16 || isZeroBytes(p.ProfileId) {
		t.Errorf("profile_id = %x, want 16 random bytes", p.ProfileId)
	}
	if bytes.Equal(p.ProfileId, gosrv.ScopeProfiles[0].Profiles[0].ProfileId) {
		t.Errorf("two profiles share an ID")
	}

	// Two threads with the same stack: one stack entry, distinct thread attributes.
	if len(p.Samples) != 3 {
		t.Fatalf("got %d samples, want 3", len(p.Samples))
	}
	s0, s1, s2 := p.Samples[0], p.Samples[1], p.Samples[2]
	if s0.StackIndex != s1.StackIndex || s0.StackIndex == 0 {
		t.Errorf("same stack got stack indices %d and %d", s0.StackIndex, s1.StackIndex)
	}
	if s2.StackIndex == s0.StackIndex {
		t.Errorf("different stacks share stack index %d", s0.StackIndex)
	}
	if got := attrs(d, s0.AttributeIndices); !slices.Equal(got, []string{"thread.id=100", "thread.name=app"}) {
		t.Errorf("sample 0 attributes = %v", got)
	}
	if got := attrs(d, s1.AttributeIndices); !slices.Equal(got, []string{"thread.id=101", "thread.name=worker"}) {
		t.Errorf("sample 1 attributes = %v", got)
	}
	if !slices.Equal(s1.AttributeIndices, s2.AttributeIndices) {
		t.Errorf("one thread, two attribute sets: %v and %v", s1.AttributeIndices, s2.AttributeIndices)
	}
	if !slices.Equal(s0.Values, []int64{3}) || len(s0.TimestampsUnixNano) != 0 {
		t.Errorf("sample 0 values %v timestamps %v, want [3] and none without Timestamps", s0.Values, s0.TimestampsUnixNano)
	}

	frames := func(s *profilespb.Sample) []string {
		var out []string
		for _, li := range d.StackTable[s.StackIndex].LocationIndices {
			out = append(out, describeLocation(d, li))
		}
		return out
	}
	want := []string{
		"0xffffffff81000010 do_syscall_64//:0 [profile.frame.type=kernel sonde.frame.symbol_source=kallsyms]",
		// Addresses are runtime addresses inside their mapping.
		"0x7f0000001234@/usr/lib/libc.so.6[0x7f0000000000-0x7f0000100000+0x28000][process.executable.build_id.htlhash=feedface] __write/__write/write.c:26 [profile.frame.type=native]",
		"0x55550500@/usr/bin/app[0x55550000-0x55560000+0x1000][process.executable.build_id.gnu=a1b2c3d4] helper/_Z6helperv/app.cc:10 work/_Z4workv/app.cc:42 [profile.frame.type=native]",
		"0x55550100@/usr/bin/app[0x55550000-0x55560000+0x1000][process.executable.build_id.gnu=a1b2c3d4] main/main/app.cc:7 [profile.frame.type=native]",
	}
	if got := frames(s0); !slices.Equal(got, want) {
		t.Errorf("stack:\n got %q\nwant %q", got, want)
	}
	// vdso has no file: runtime address, mapping named by its path.
	if got := frames(s2)[0]; got != "0x7fff0800@[vdso][0x7fff0000-0x7fff2000+0x0][] [profile.frame.type=native]" {
		t.Errorf("vdso frame = %q", got)
	}
	goFrames := frames(gosrv.ScopeProfiles[0].Profiles[0].Samples[0])
	if !strings.Contains(goFrames[1], "process.executable.build_id.gnu=99887766 process.executable.build_id.go=gobuild/abc") ||
		!strings.Contains(goFrames[1], "main.handle/main.handle//src/main.go:30 [profile.frame.type=go]") {
		t.Errorf("go frame = %q", goFrames[1])
	}
	// The kernel location is shared by both processes' stacks.
	if d.StackTable[s0.StackIndex].LocationIndices[0] != d.StackTable[gosrv.ScopeProfiles[0].Profiles[0].Samples[0].StackIndex].LocationIndices[0] {
		t.Errorf("kernel location not shared between processes")
	}
	// Every frame type attribute is one entry however many locations use it.
	n := 0
	for _, a := range d.AttributeTable {
		if d.StringTable[a.KeyStrindex] == "profile.frame.type" {
			n++
		}
	}
	if n != 3 {
		t.Errorf("%d profile.frame.type attributes, want 3 (kernel, native, go)", n)
	}
}

func TestEncodeIntervalsAndDedupByValue(t *testing.T) {
	// Two intervals describing the same process and code with different pointers, as
	// successive intervals do: one resource, two profiles, one dictionary entry each.
	a, b := newFixture(), newFixture()
	b.profile.Start = t0.Add(10 * time.Second)
	b.profile.End = t0.Add(20 * time.Second)
	req := Encode([]*trace.Profile{a.profile, b.profile}, testHost, EncodeOptions{})
	checkDictionary(t, req)
	if len(req.ResourceProfiles) != 2 {
		t.Fatalf("got %d resources, want 2", len(req.ResourceProfiles))
	}
	for _, rp := range req.ResourceProfiles {
		if n := len(rp.ScopeProfiles[0].Profiles); n != 2 {
			t.Errorf("got %d profiles, want one per interval", n)
		}
	}
	one := Encode([]*trace.Profile{a.profile}, testHost, EncodeOptions{})
	for name, n := range map[string][2]int{
		"locations": {len(one.Dictionary.LocationTable), len(req.Dictionary.LocationTable)},
		"mappings":  {len(one.Dictionary.MappingTable), len(req.Dictionary.MappingTable)},
		"stacks":    {len(one.Dictionary.StackTable), len(req.Dictionary.StackTable)},
		"functions": {len(one.Dictionary.FunctionTable), len(req.Dictionary.FunctionTable)},
		"attrs":     {len(one.Dictionary.AttributeTable), len(req.Dictionary.AttributeTable)},
		"strings":   {len(one.Dictionary.StringTable), len(req.Dictionary.StringTable)},
	} {
		if n[0] != n[1] {
			t.Errorf("%s: one interval has %d, two identical intervals %d", name, n[0], n[1])
		}
	}
}

func TestEncodeTimestamps(t *testing.T) {
	f := newFixture()
	req := Encode([]*trace.Profile{f.profile}, testHost, EncodeOptions{Timestamps: true})
	samples := req.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].Samples
	s0 := samples[0]
	want := []uint64{uint64(t0.Add(time.Second).UnixNano()), uint64(t0.Add(2 * time.Second).UnixNano()), uint64(t0.Add(3 * time.Second).UnixNano())}
	if len(s0.Values) != 0 || !slices.Equal(s0.TimestampsUnixNano, want) {
		t.Errorf("timestamped sample: values %v timestamps %v, want none and %v", s0.Values, s0.TimestampsUnixNano, want)
	}
	// No timestamps recorded: the count stands alone.
	if s1 := samples[1]; !slices.Equal(s1.Values, []int64{2}) || len(s1.TimestampsUnixNano) != 0 {
		t.Errorf("untimestamped sample: values %v timestamps %v", s1.Values, s1.TimestampsUnixNano)
	}
}

func TestEncodeMergesSameIdentity(t *testing.T) {
	f := newFixture()
	dup := *f.profile.Samples[1]
	dup.Count = 4
	f.profile.Samples = append(f.profile.Samples, &dup)
	req := Encode([]*trace.Profile{f.profile}, testHost, EncodeOptions{})
	samples := req.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].Samples
	if len(samples) != 3 || !slices.Equal(samples[1].Values, []int64{6}) {
		t.Errorf("samples of one stack and thread not merged: %d samples, values %v", len(samples), samples[1].Values)
	}
}

func TestEncodeEmpty(t *testing.T) {
	req := Encode(nil, Resource{}, EncodeOptions{})
	checkDictionary(t, req)
	if len(req.ResourceProfiles) != 0 {
		t.Errorf("empty input gave %d resources", len(req.ResourceProfiles))
	}
	// A sample without a process still gets the host resource.
	p := &trace.Profile{Start: t0, End: t0.Add(time.Second), Samples: []*trace.Sample{{TID: 1, Count: 1}}}
	req = Encode([]*trace.Profile{p}, testHost, EncodeOptions{})
	checkDictionary(t, req)
	if len(req.ResourceProfiles) != 1 {
		t.Fatalf("got %d resources", len(req.ResourceProfiles))
	}
	if _, ok := resourceAttr(req.ResourceProfiles[0], "process.pid"); ok {
		t.Errorf("process.pid set for an unknown process")
	}
	if v, _ := resourceAttr(req.ResourceProfiles[0], "host.name"); v != "box" {
		t.Errorf("host.name = %v", v)
	}
}

// A process's own attributes win over the agent's environment; service.name in sonde's
// environment names sonde, not the processes it profiles, which are named by their own.
func TestEncodeProcessAttributesWinOverEnv(t *testing.T) {
	host := Resource{HostName: "box", Attributes: map[string]string{"process.pid": "1", "host.name": "override", "service.name": "sonde", "deployment.environment": "prod"}}
	f := newFixture()
	req := Encode([]*trace.Profile{f.profile}, host, EncodeOptions{})
	rp := req.ResourceProfiles[0]
	for key, want := range map[string]any{"process.pid": int64(100), "host.name": "override", "service.name": "app", "deployment.environment": "prod"} {
		if got, _ := resourceAttr(rp, key); got != want {
			t.Errorf("%s = %v, want %v", key, got, want)
		}
	}
	seen := map[string]bool{}
	for _, kv := range rp.Resource.Attributes {
		if seen[kv.Key] {
			t.Errorf("resource attribute %s twice", kv.Key)
		}
		seen[kv.Key] = true
	}
}

// A thread, process, path or symbol name that is not UTF-8 (any process can set such a
// name) is repaired, and the request still marshals: one odd name must not cost the
// profiles of every other process.
func TestEncodeRepairsInvalidUTF8(t *testing.T) {
	bad := "w\xffrk\xc3"
	exe := objfile.HostFile(objfile.Key{Dev: 1, Inode: 2}, "/opt/"+bad)
	m := &trace.Mapping{Start: 0x1000, End: 0x2000, Path: "/opt/" + bad, File: exe}
	loc := &trace.Location{Kind: trace.FrameNative, Address: 0x1010, Mapping: m,
		Lines: []trace.Line{{Function: bad, SystemName: bad, File: bad + ".c", Line: 3}}}
	p := &trace.Profile{Start: t0, End: t0.Add(time.Second), Period: time.Second / 19, Locations: []*trace.Location{loc},
		Samples: []*trace.Sample{{Process: &trace.Process{PID: 7, Name: bad, ExePath: "/opt/" + bad}, TID: 8, ThreadName: bad,
			Locations: []*trace.Location{loc}, Count: 1}}}
	req := Encode([]*trace.Profile{p}, Resource{HostName: "h\xfe", Attributes: map[string]string{"k\xff": bad}}, EncodeOptions{})
	raw, err := proto.Marshal(req)
	if err != nil {
		t.Fatalf("marshal a request with repaired names: %v", err)
	}
	if _, err := MarshalJSON(req); err != nil {
		t.Errorf("OTLP/JSON: %v", err)
	}
	if !bytes.Contains(raw, []byte("w\uFFFDrk\uFFFD")) {
		t.Errorf("the name is not in the request with its invalid bytes replaced")
	}
}

// service.name comes from what describes the process best: a Describer's, else the
// service name in its environment, else its executable's name.
func TestEncodeServiceName(t *testing.T) {
	for _, tc := range []struct {
		proc trace.Process
		want string
	}{
		{trace.Process{PID: 1, Name: "app"}, "app"},
		{trace.Process{PID: 1, ExePath: "/usr/bin/server"}, "server"},
		{trace.Process{PID: 1, Name: "app", EnvServiceName: "checkout"}, "checkout"},
		{trace.Process{PID: 1, Name: "app", EnvServiceName: "checkout", Attributes: map[string]string{"service.name": "cart", "k8s.pod.name": "cart-1"}}, "cart"},
		{trace.Process{PID: 1}, "unknown_service"},
	} {
		p := &trace.Profile{Start: t0, End: t0.Add(time.Second), Samples: []*trace.Sample{{Process: &tc.proc, TID: 1, Count: 1}}}
		req := Encode([]*trace.Profile{p}, Resource{}, EncodeOptions{})
		if got, _ := resourceAttr(req.ResourceProfiles[0], "service.name"); got != tc.want {
			t.Errorf("%+v: service.name %v, want %s", tc.proc, got, tc.want)
		}
		if tc.proc.Attributes != nil {
			if got, _ := resourceAttr(req.ResourceProfiles[0], "k8s.pod.name"); got != "cart-1" {
				t.Errorf("k8s.pod.name %v", got)
			}
		}
	}
}
