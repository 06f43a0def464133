package otlp

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/profiles/v1development"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

// t0 is the start of the test intervals.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// fixture is a small interval with two processes, shared code, inlined lines,
// kernel frames and a mapping without a file.
type fixture struct {
	app, goProc                *trace.Process
	appExe, libc, goExe        *objfile.File
	appMap, libcMap, vdso, goM *trace.Mapping
	profile                    *trace.Profile
}

func newFixture() *fixture {
	f := &fixture{}
	f.app = &trace.Process{PID: 100, Name: "app", ExePath: "/usr/bin/app"}
	f.goProc = &trace.Process{PID: 200, Name: "goserver", ExePath: "/srv/goserver", ContainerID: "c0ffee"}

	f.appExe = objfile.HostFile(objfile.Key{Dev: 1, Inode: 10}, "/usr/bin/app")
	f.appExe.GNUBuildID = "a1b2c3d4"
	f.libc = objfile.HostFile(objfile.Key{Dev: 1, Inode: 11}, "/usr/lib/libc.so.6")
	f.libc.HTLHash = "feedface"
	f.goExe = objfile.HostFile(objfile.Key{Dev: 1, Inode: 12}, "/srv/goserver")
	f.goExe.GoBuildID = "gobuild/abc"
	f.goExe.GNUBuildID = "99887766"
	f.goExe.IsGo = true

	f.appMap = &trace.Mapping{Start: 0x55550000, End: 0x55560000, Offset: 0x1000, Path: "/usr/bin/app", File: f.appExe}
	f.libcMap = &trace.Mapping{Start: 0x7f0000000000, End: 0x7f0000100000, Offset: 0x28000, Path: "/usr/lib/libc.so.6", File: f.libc}
	f.vdso = &trace.Mapping{Start: 0x7fff0000, End: 0x7fff2000, Path: "[vdso]"}
	f.goM = &trace.Mapping{Start: 0x400000, End: 0x900000, Path: "/srv/goserver", File: f.goExe}

	kernel := &trace.Location{Kind: trace.FrameKernel, Address: 0xffffffff81000010,
		Lines: []trace.Line{{Function: "do_syscall_64"}}, NameSource: "kallsyms"}
	write := &trace.Location{Kind: trace.FrameNative, Address: 0x7f0000001234, Mapping: f.libcMap,
		Lines: []trace.Line{{Function: "__write", SystemName: "__write", File: "write.c", Line: 26}}}
	// Inlined: helper into work.
	work := &trace.Location{Kind: trace.FrameNative, Address: 0x55550500, Mapping: f.appMap,
		Lines: []trace.Line{
			{Function: "helper", SystemName: "_Z6helperv", File: "app.cc", Line: 10},
			{Function: "work", SystemName: "_Z4workv", File: "app.cc", Line: 42},
		}}
	mainLoc := &trace.Location{Kind: trace.FrameNative, Address: 0x55550100, Mapping: f.appMap,
		Lines: []trace.Line{{Function: "main", SystemName: "main", File: "app.cc", Line: 7}}}
	clock := &trace.Location{Kind: trace.FrameNative, Address: 0x7fff0800, Mapping: f.vdso}
	goLeaf := &trace.Location{Kind: trace.FrameGo, Address: 0x401000, Mapping: f.goM,
		Lines: []trace.Line{{Function: "main.handle", SystemName: "main.handle", File: "/src/main.go", Line: 30}}}
	goMain := &trace.Location{Kind: trace.FrameGo, Address: 0x402000, Mapping: f.goM,
		Lines: []trace.Line{{Function: "main.main", SystemName: "main.main", File: "/src/main.go", Line: 12}}}

	appStack := []*trace.Location{kernel, write, work, mainLoc}
	f.profile = &trace.Profile{
		Start:  t0,
		End:    t0.Add(10 * time.Second),
		Period: 10 * time.Millisecond,
		Samples: []*trace.Sample{
			// Same stack, two threads: one stack entry, different thread attributes.
			{Process: f.app, TID: 100, ThreadName: "app", Locations: appStack, Count: 3,
				Timestamps: []time.Time{t0.Add(time.Second), t0.Add(2 * time.Second), t0.Add(3 * time.Second)}},
			{Process: f.app, TID: 101, ThreadName: "worker", Locations: appStack, Count: 2},
			{Process: f.app, TID: 101, ThreadName: "worker", Locations: []*trace.Location{clock, mainLoc}, Count: 1},
			{Process: f.goProc, TID: 200, ThreadName: "goserver", Locations: []*trace.Location{kernel, goLeaf, goMain}, Count: 5},
		},
		Locations: []*trace.Location{kernel, write, work, mainLoc, clock, goLeaf, goMain},
	}
	return f
}

var testHost = Resource{HostName: "box", HostID: "machine-1", Attributes: map[string]string{"deployment.environment": "test"}}

// checkDictionary fails t unless every table starts with its zero value, holds no
// duplicates, and every index in req points into its table.
func checkDictionary(t testing.TB, req *collectorpb.ExportProfilesServiceRequest) {
	t.Helper()
	d := req.Dictionary
	if d == nil {
		t.Fatal("no dictionary")
	}
	if len(d.StringTable) == 0 || d.StringTable[0] != "" {
		t.Errorf("string_table[0] is not \"\"")
	}
	zero := func(name string, n int, first proto.Message, want proto.Message) {
		t.Helper()
		if n == 0 {
			t.Errorf("%s is empty, want the zero value at index 0", name)
			return
		}
		if !proto.Equal(first, want) {
			t.Errorf("%s[0] = %v, want the zero value", name, first)
		}
	}
	zero("mapping_table", len(d.MappingTable), d.MappingTable[0], &profilespb.Mapping{})
	zero("location_table", len(d.LocationTable), d.LocationTable[0], &profilespb.Location{})
	zero("function_table", len(d.FunctionTable), d.FunctionTable[0], &profilespb.Function{})
	zero("attribute_table", len(d.AttributeTable), d.AttributeTable[0], &profilespb.KeyValueAndUnit{})
	zero("stack_table", len(d.StackTable), d.StackTable[0], &profilespb.Stack{})
	if len(d.LinkTable) == 0 || !isZeroBytes(d.LinkTable[0].TraceId) || !isZeroBytes(d.LinkTable[0].SpanId) {
		t.Errorf("link_table[0] is not a zero link")
	}

	noDups := func(name string, n int, at func(int) proto.Message) {
		t.Helper()
		seen := make(map[string]int, n)
		for i := range n {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(at(i))
			if err != nil {
				t.Fatal(err)
			}
			if j, ok := seen[string(b)]; ok {
				t.Errorf("%s[%d] duplicates %s[%d]", name, i, name, j)
			}
			seen[string(b)] = i
		}
	}
	noDups("mapping_table", len(d.MappingTable), func(i int) proto.Message { return d.MappingTable[i] })
	noDups("location_table", len(d.LocationTable), func(i int) proto.Message { return d.LocationTable[i] })
	noDups("function_table", len(d.FunctionTable), func(i int) proto.Message { return d.FunctionTable[i] })
	noDups("attribute_table", len(d.AttributeTable), func(i int) proto.Message { return d.AttributeTable[i] })
	noDups("stack_table", len(d.StackTable), func(i int) proto.Message { return d.StackTable[i] })
	noDups("link_table", len(d.LinkTable), func(i int) proto.Message { return d.LinkTable[i] })
	strs := make(map[string]bool)
	for i, s := range d.StringTable {
		if strs[s] {
			t.Errorf("string_table[%d] = %q is a duplicate", i, s)
		}
		strs[s] = true
	}

	in := func(what string, i int32, n int) {
		t.Helper()
		if i < 0 || int(i) >= n {
			t.Fatalf("%s index %d out of range [0,%d)", what, i, n)
		}
	}
	ns, na := len(d.StringTable), len(d.AttributeTable)
	for _, a := range d.AttributeTable {
		in("attribute key", a.KeyStrindex, ns)
		in("attribute unit", a.UnitStrindex, ns)
	}
	for _, m := range d.MappingTable {
		in("mapping filename", m.FilenameStrindex, ns)
		for _, a := range m.AttributeIndices {
			in("mapping attribute", a, na)
		}
	}
	for _, f := range d.FunctionTable {
		in("function name", f.NameStrindex, ns)
		in("function system name", f.SystemNameStrindex, ns)
		in("function filename", f.FilenameStrindex, ns)
	}
	for _, l := range d.LocationTable {
		in("location mapping", l.MappingIndex, len(d.MappingTable))
		for _, a := range l.AttributeIndices {
			in("location attribute", a, na)
		}
		for _, ln := range l.Lines {
			in("line function", ln.FunctionIndex, len(d.FunctionTable))
		}
	}
	for _, s := range d.StackTable {
		for _, l := range s.LocationIndices {
			in("stack location", l, len(d.LocationTable))
		}
	}
	for _, rp := range req.ResourceProfiles {
		for _, sp := range rp.ScopeProfiles {
			for _, p := range sp.Profiles {
				in("sample type", p.SampleType.GetTypeStrindex(), ns)
				in("period type", p.PeriodType.GetTypeStrindex(), ns)
				for _, s := range p.Samples {
					in("sample stack", s.StackIndex, len(d.StackTable))
					in("sample link", s.LinkIndex, len(d.LinkTable))
					for _, a := range s.AttributeIndices {
						in("sample attribute", a, na)
					}
				}
			}
		}
	}
}

func isZeroBytes(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// resourceAttr returns the attribute key of a resource as a Go value.
func resourceAttr(rp *profilespb.ResourceProfiles, key string) (any, bool) {
	for _, kv := range rp.GetResource().GetAttributes() {
		if kv.Key == key {
			return anyValue(kv.Value), true
		}
	}
	return nil, false
}

func anyValue(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	default:
		return fmt.Sprint(v)
	}
}

// attrs resolves attribute indices to key=value strings.
func attrs(d *profilespb.ProfilesDictionary, idx []int32) []string {
	var out []string
	for _, i := range idx {
		a := d.AttributeTable[i]
		out = append(out, fmt.Sprintf("%s=%v", d.StringTable[a.KeyStrindex], anyValue(a.Value)))
	}
	sort.Strings(out)
	return out
}

// describeLocation renders a location with everything it references.
func describeLocation(d *profilespb.ProfilesDictionary, li int32) string {
	l := d.LocationTable[li]
	var b strings.Builder
	fmt.Fprintf(&b, "%#x", l.Address)
	if l.MappingIndex != 0 {
		m := d.MappingTable[l.MappingIndex]
		fmt.Fprintf(&b, "@%s[%#x-%#x+%#x]%v", d.StringTable[m.FilenameStrindex], m.MemoryStart, m.MemoryLimit, m.FileOffset, attrs(d, m.AttributeIndices))
	}
	for _, ln := range l.Lines {
		f := d.FunctionTable[ln.FunctionIndex]
		fmt.Fprintf(&b, " %s/%s/%s:%d", d.StringTable[f.NameStrindex], d.StringTable[f.SystemNameStrindex], d.StringTable[f.FilenameStrindex], ln.Line)
	}
	fmt.Fprintf(&b, " %v", attrs(d, l.AttributeIndices))
	return b.String()
}

// canonicalSamples renders every sample of req with all it references, sorted, so
// that requests can be compared whatever their dictionaries' order.
func canonicalSamples(req *collectorpb.ExportProfilesServiceRequest) []string {
	d := req.Dictionary
	var out []string
	for _, rp := range req.ResourceProfiles {
		pid, _ := resourceAttr(rp, keyProcessPID)
		for _, sp := range rp.ScopeProfiles {
			for _, p := range sp.Profiles {
				for _, s := range p.Samples {
					var frames []string
					for _, li := range d.StackTable[s.StackIndex].LocationIndices {
						frames = append(frames, describeLocation(d, li))
					}
					out = append(out, fmt.Sprintf("pid=%v t=%d period=%d %v values=%v ts=%v | %s",
						pid, p.TimeUnixNano, p.Period, attrs(d, s.AttributeIndices), s.Values, s.TimestampsUnixNano,
						strings.Join(frames, " ; ")))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// synthetic makes an interval of nSamples samples over nStacks distinct stacks of
// about depth frames, spread over processes and threads the way a busy host looks:
// stacks share their outer frames (main, runtime, libc), hot stacks get most samples,
// and each process has its own mappings. nameLen pads function names, to make
// intervals as big as a test needs.
func synthetic(seed uint64, nProcs, nSamples, nStacks, depth, nameLen int, start time.Time) *trace.Profile {
	r := rand.New(rand.NewPCG(seed, 42))
	p := &trace.Profile{Start: start, End: start.Add(10 * time.Second), Period: time.Second / 99}
	pad := strings.Repeat("x", nameLen)
	type proc struct {
		p      *trace.Process
		locs   []*trace.Location
		stacks [][]*trace.Location
	}
	kernel := make([]*trace.Location, 30)
	for i := range kernel {
		kernel[i] = &trace.Location{Kind: trace.FrameKernel, Address: 0xffffffff81000000 + uint64(i)*0x40,
			Lines: []trace.Line{{Function: fmt.Sprintf("kernel_fn_%d", i)}}}
		p.Locations = append(p.Locations, kernel[i])
	}
	procs := make([]*proc, nProcs)
	for pi := range procs {
		exe := objfile.HostFile(objfile.Key{Dev: 1, Inode: uint64(1000 + pi)}, fmt.Sprintf("/usr/bin/svc%d", pi))
		exe.GNUBuildID = fmt.Sprintf("%040x", pi+1)
		libc := objfile.HostFile(objfile.Key{Dev: 1, Inode: 1}, "/usr/lib/libc.so.6")
		libc.GNUBuildID = "c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0"
		base := uint64(0x55550000) + uint64(pi)<<24
		maps := []*trace.Mapping{
			{Start: base, End: base + 0x1000000, Offset: 0x1000, Path: exe.Path, File: exe},
			{Start: 0x7f0000000000 + uint64(pi)<<32, End: 0x7f0000200000 + uint64(pi)<<32, Offset: 0x28000, Path: libc.Path, File: libc},
		}
		pr := &proc{p: &trace.Process{PID: uint32(1000 + pi), Name: fmt.Sprintf("svc%d", pi), ExePath: exe.Path}}
		nLocs := 2*nStacks/nProcs + 50
		for li := range nLocs {
			m := maps[0]
			if li%5 == 0 {
				m = maps[1]
			}
			l := &trace.Location{Kind: trace.FrameNative, Address: m.Start + uint64(li)*0x10 + 0x100, Mapping: m,
				Lines: []trace.Line{{Function: fmt.Sprintf("fn_%d_%d%s", pi, li, pad), SystemName: fmt.Sprintf("_Z%d_%d", pi, li),
					File: fmt.Sprintf("src/file%d.c", li%40), Line: int64(li%500 + 1)}}}
			if li%7 == 0 {
				l.Lines = append(l.Lines, trace.Line{Function: fmt.Sprintf("inlined_%d", li%50), File: "inl.h", Line: 3})
			}
			pr.locs = append(pr.locs, l)
			p.Locations = append(p.Locations, l)
		}
		procs[pi] = pr
	}
	// Stacks: a few outer frames shared by all, a middle drawn from a parent stack
	// of the same process, and a fresh leaf part.
	for si := range nStacks {
		pr := procs[si%nProcs]
		var st []*trace.Location
		outer := pr.locs[:5]
		if len(pr.stacks) > 0 && r.IntN(4) != 0 {
			parent := pr.stacks[r.IntN(len(pr.stacks))]
			keep := min(len(parent), depth/2+r.IntN(depth/2+1))
			st = append(st, parent[len(parent)-keep:]...)
		} else {
			st = append(st, outer...)
			slices.Reverse(st)
		}
		for len(st) < depth+r.IntN(5)-2 {
			st = append([]*trace.Location{pr.locs[5+r.IntN(len(pr.locs)-5)]}, st...)
		}
		if r.IntN(3) == 0 {
			st = append([]*trace.Location{kernel[r.IntN(len(kernel))]}, st...)
		}
		pr.stacks = append(pr.stacks, st)
	}
	for i := range nSamples {
		pr := procs[i%nProcs]
		// Zipf-like: low stack numbers are hot.
		n := len(pr.stacks)
		si := min(n-1, int(float64(n)*r.Float64()*r.Float64()))
		if i < nStacks {
			si = i / nProcs // every stack is sampled at least once
		}
		tid := pr.p.PID + uint32(r.IntN(8))
		p.Samples = append(p.Samples, &trace.Sample{
			Process:    pr.p,
			TID:        tid,
			ThreadName: fmt.Sprintf("%s-%d", pr.p.Name, tid-pr.p.PID),
			Locations:  pr.stacks[si],
			Count:      int64(1 + r.IntN(3)),
		})
	}
	return p
}
