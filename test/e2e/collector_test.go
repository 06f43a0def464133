package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/trace"
)

var t0 = time.Now().Truncate(time.Second).Add(-time.Minute)

// fixture is an interval with a C++ process and a Go process in a container.
func fixture() *trace.Profile {
	app := &trace.Process{PID: 4242, Name: "app", ExePath: "/usr/bin/app"}
	gosrv := &trace.Process{PID: 4343, Name: "goserver", ExePath: "/srv/goserver", ContainerID: "0123456789abcdef"}

	appExe := objfile.HostFile(objfile.Key{Dev: 1, Inode: 10}, "/usr/bin/app")
	appExe.GNUBuildID = "aabbccddeeff00112233445566778899aabbccdd"
	libc := objfile.HostFile(objfile.Key{Dev: 1, Inode: 11}, "/usr/lib/libc.so.6")
	libc.HTLHash = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
	goExe := objfile.HostFile(objfile.Key{Dev: 1, Inode: 12}, "/srv/goserver")
	goExe.GoBuildID = "Zx1/Zx2/Zx3/Zx4"
	goExe.IsGo = true

	appMap := &trace.Mapping{Start: 0x55550000, End: 0x55560000, Offset: 0x1000, Path: "/usr/bin/app", File: appExe}
	libcMap := &trace.Mapping{Start: 0x7f0000000000, End: 0x7f0000100000, Offset: 0x28000, Path: "/usr/lib/libc.so.6", File: libc}
	goMap := &trace.Mapping{Start: 0x400000, End: 0x900000, Path: "/srv/goserver", File: goExe}

	kernel := &trace.Location{Kind: trace.FrameKernel, Address: 0xffffffff81000010, Lines: []trace.Line{{Function: "do_syscall_64"}}}
	write := &trace.Location{Kind: trace.FrameNative, Address: 0x7f0000001234, Mapping: libcMap,
		Lines: []trace.Line{{Function: "__write", SystemName: "__write", File: "write.c", Line: 26}}}
	work := &trace.Location{Kind: trace.FrameNative, Address: 0x55550500, Mapping: appMap,
		Lines: []trace.Line{{Function: "helper", SystemName: "_Z6helperv", File: "app.cc", Line: 10}, {Function: "work", SystemName: "_Z4workv", File: "app.cc", Line: 42}}}
	mainLoc := &trace.Location{Kind: trace.FrameNative, Address: 0x55550100, Mapping: appMap,
		Lines: []trace.Line{{Function: "main", SystemName: "main", File: "app.cc", Line: 7}}}
	goLeaf := &trace.Location{Kind: trace.FrameGo, Address: 0x401000, Mapping: goMap,
		Lines: []trace.Line{{Function: "main.handle", SystemName: "main.handle", File: "/src/main.go", Line: 30}}}
	goMain := &trace.Location{Kind: trace.FrameGo, Address: 0x402000, Mapping: goMap,
		Lines: []trace.Line{{Function: "main.main", SystemName: "main.main", File: "/src/main.go", Line: 12}}}

	stack := []*trace.Location{kernel, write, work, mainLoc}
	return &trace.Profile{
		Start: t0, End: t0.Add(10 * time.Second), Period: time.Second / 99,
		Samples: []*trace.Sample{
			{Process: app, TID: 4242, ThreadName: "app", Locations: stack, Count: 3,
				Timestamps: []time.Time{t0.Add(time.Second), t0.Add(2 * time.Second), t0.Add(3 * time.Second)}},
			{Process: app, TID: 4244, ThreadName: "worker", Locations: stack, Count: 2},
			{Process: gosrv, TID: 4343, ThreadName: "goserver", Locations: []*trace.Location{kernel, goLeaf, goMain}, Count: 5},
		},
		Locations: []*trace.Location{kernel, write, work, mainLoc, goLeaf, goMain},
	}
}

// send delivers profiles to endpoint with sonde's exporter and waits until the
// exporter has no more to send.
func send(t *testing.T, endpoint string, profiles ...*trace.Profile) otlp.Stats {
	t.Helper()
	e, err := otlp.New(otlp.Config{Endpoint: endpoint, Insecure: true, Timeout: 10 * time.Second},
		otlp.WithResource(otlp.Resource{HostName: "e2e-host", HostID: "e2e-machine-id", Attributes: map[string]string{"service.name": "sonde-e2e"}}),
		otlp.WithEncodeOptions(otlp.EncodeOptions{Version: "e2e", Timestamps: true}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	e.EnqueueProfiles(profiles...)
	deadline := time.Now().Add(30 * time.Second)
	for e.Stats().Queued > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("exporter: %v", err)
	}
	s := e.Stats()
	if s.Queued > 0 || s.RejectedRequests > 0 || s.RejectedProfiles > 0 || s.DroppedIntervals > 0 {
		t.Fatalf("exporter did not deliver everything: %+v", s)
	}
	return s
}

func TestCollectorReceivesProfiles(t *testing.T) {
	c := StartCollector(t)
	p := fixture()
	stats := send(t, c.Endpoint, p)
	if stats.SentSamples != uint64(p.TotalCount()) {
		t.Errorf("exporter sent %d samples, want %d", stats.SentSamples, p.TotalCount())
	}
	msgs := c.WaitFor(t, 20*time.Second, func(m []*profilespb.ProfilesData) bool { return Summarize(m).Samples >= p.TotalCount() })
	v := Summarize(msgs)

	if v.Samples != p.TotalCount() || v.Profiles != 2 {
		t.Errorf("collector wrote %d samples in %d profiles, want %d in 2", v.Samples, v.Profiles, p.TotalCount())
	}
	for _, f := range []string{"do_syscall_64", "__write", "helper", "work", "main", "main.handle", "main.main"} {
		if !v.Functions[f] {
			t.Errorf("function %q missing; have %v", f, v.Functions)
		}
	}
	wantMappings := map[string][]string{
		"/usr/bin/app":       {"process.executable.build_id.gnu=aabbccddeeff00112233445566778899aabbccdd"},
		"/usr/lib/libc.so.6": {"process.executable.build_id.htlhash=0f1e2d3c4b5a69788796a5b4c3d2e1f0"},
		"/srv/goserver":      {"process.executable.build_id.go=Zx1/Zx2/Zx3/Zx4"},
	}
	for file, want := range wantMappings {
		if got := v.Mappings[file]; !slices.Equal(got, want) {
			t.Errorf("mapping %s attributes = %v, want %v", file, got, want)
		}
	}
	for _, k := range []string{"kernel", "native", "go"} {
		if !v.FrameTypes[k] {
			t.Errorf("no %s frames; have %v", k, v.FrameTypes)
		}
	}
	for _, th := range []string{"app", "worker", "goserver"} {
		if !v.Threads[th] {
			t.Errorf("thread %q missing; have %v", th, v.Threads)
		}
	}
	byPID := map[int64]map[string]any{}
	for _, r := range v.Resources {
		pid, _ := r["process.pid"].(int64)
		byPID[pid] = r
	}
	// The agent's own service.name does not name the processes it profiles: each is named
	// by what it declares, else by its executable.
	for pid, want := range map[int64]map[string]any{
		4242: {"process.executable.name": "app", "process.executable.path": "/usr/bin/app", "host.name": "e2e-host",
			"host.id": "e2e-machine-id", "os.type": "linux", "service.name": "app"},
		4343: {"process.executable.name": "goserver", "container.id": "0123456789abcdef", "service.name": "goserver"},
	} {
		r := byPID[pid]
		if r == nil {
			t.Errorf("no resource for pid %d; have %v", pid, v.Resources)
			continue
		}
		for k, w := range want {
			if r[k] != w {
				t.Errorf("pid %d: %s = %v, want %v", pid, k, r[k], w)
			}
		}
	}
	if _, ok := byPID[4242]["container.id"]; ok {
		t.Errorf("container.id on a process outside containers")
	}
	for _, s := range v.Scopes {
		if s != "sonde/e2e" {
			t.Errorf("scope %q, want sonde/e2e", s)
		}
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if log := c.ReadLog(); !strings.Contains(log, "Profiles") {
		t.Errorf("debug exporter logged no profiles:\n%s", lastLines(log, 20))
	}
}

// bigInterval is one process with so many distinct, long-named functions that its
// request is several times the collector's 4 MiB limit.
func bigInterval() *trace.Profile {
	proc := &trace.Process{PID: 777, Name: "big", ExePath: "/usr/bin/big"}
	exe := objfile.HostFile(objfile.Key{Dev: 1, Inode: 77}, "/usr/bin/big")
	exe.GNUBuildID = "77777777777777777777777777777777"
	m := &trace.Mapping{Start: 0x10000000, End: 0x20000000, Path: exe.Path, File: exe}
	p := &trace.Profile{Start: t0, End: t0.Add(10 * time.Second), Period: time.Second / 99}
	pad := strings.Repeat("n", 300)
	var locs []*trace.Location
	for i := range 40000 {
		l := &trace.Location{Kind: trace.FrameNative, Address: m.Start + uint64(i)*16, Mapping: m,
			Lines: []trace.Line{{Function: fmt.Sprintf("fn%d_%s", i, pad), File: "big.c", Line: int64(i)}}}
		locs = append(locs, l)
		p.Locations = append(p.Locations, l)
	}
	for i := range 8000 {
		stack := make([]*trace.Location, 0, 10)
		for j := range 10 {
			stack = append(stack, locs[(i*5+j*7919)%len(locs)])
		}
		p.Samples = append(p.Samples, &trace.Sample{Process: proc, TID: 777 + uint32(i%4), ThreadName: "big", Locations: stack, Count: int64(1 + i%3)})
	}
	return p
}

func TestCollectorAcceptsSplitIntervals(t *testing.T) {
	p := bigInterval()
	req := otlp.Encode([]*trace.Profile{p}, otlp.Resource{}, otlp.EncodeOptions{})
	if n := proto.Size(req); n < 2*otlp.MaxRequestBytes {
		t.Fatalf("test interval is %d bytes, want over %d", n, 2*otlp.MaxRequestBytes)
	}
	c := StartCollector(t)
	stats := send(t, c.Endpoint, p)
	if stats.SentRequests < 2 {
		t.Errorf("an interval over 4 MiB went as %d request(s)", stats.SentRequests)
	}
	msgs := c.WaitFor(t, 30*time.Second, func(m []*profilespb.ProfilesData) bool { return Summarize(m).Samples >= p.TotalCount() })
	if got := Summarize(msgs).Samples; got != p.TotalCount() {
		t.Errorf("collector got %d samples, want %d", got, p.TotalCount())
	}
}

// The collector's own decoders accept sonde's file formats and read the same data
// from both.
func TestCollectorDecodesFiles(t *testing.T) {
	req := otlp.Encode([]*trace.Profile{fixture()}, otlp.Resource{HostName: "h"}, otlp.EncodeOptions{Version: "v", Timestamps: true})
	want := Summarize([]*profilespb.ProfilesData{{ResourceProfiles: req.ResourceProfiles, Dictionary: req.Dictionary}})
	viaPdata := func(pp pprofile.Profiles) Summary {
		t.Helper()
		b, err := (&pprofile.ProtoMarshaler{}).MarshalProfiles(pp)
		if err != nil {
			t.Fatal(err)
		}
		var pd profilespb.ProfilesData
		if err := proto.Unmarshal(b, &pd); err != nil {
			t.Fatal(err)
		}
		return Summarize([]*profilespb.ProfilesData{&pd})
	}

	dir := t.TempDir()
	pbPath, jsonPath := filepath.Join(dir, "p.otlp.pb"), filepath.Join(dir, "p.otlp.json")
	if err := otlp.WriteFile(pbPath, req); err != nil {
		t.Fatal(err)
	}
	if err := otlp.WriteFile(jsonPath, req); err != nil {
		t.Fatal(err)
	}
	pb, err := os.ReadFile(pbPath)
	if err != nil {
		t.Fatal(err)
	}
	fromProto, err := (&pprofile.ProtoUnmarshaler{}).UnmarshalProfiles(pb)
	if err != nil {
		t.Fatalf("pdata rejects the .otlp.pb form: %v", err)
	}
	if got := viaPdata(fromProto); !reflect.DeepEqual(got, want) {
		t.Errorf("pdata reads the .otlp.pb form differently:\n got %+v\nwant %+v", got, want)
	}

	js, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	fromJSON, err := (&pprofile.JSONUnmarshaler{}).UnmarshalProfiles(js)
	if err != nil {
		t.Fatalf("pdata rejects the .otlp.json form: %v", err)
	}
	if got := viaPdata(fromJSON); !reflect.DeepEqual(got, want) {
		t.Errorf("pdata reads the .otlp.json form differently:\n got %+v\nwant %+v", got, want)
	}
	id := fromJSON.ResourceProfiles().At(0).ScopeProfiles().At(0).Profiles().At(0).ProfileID()
	if want := req.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].ProfileId; !slices.Equal(id[:], want) {
		t.Errorf("profile ID read from JSON %x, want %x", id, want)
	}
	// And the collector's JSON of the same data decodes back to it too.
	cj, err := (&pprofile.JSONMarshaler{}).MarshalProfiles(fromProto)
	if err != nil {
		t.Fatal(err)
	}
	back, err := (&pprofile.JSONUnmarshaler{}).UnmarshalProfiles(cj)
	if err != nil {
		t.Fatal(err)
	}
	if got := viaPdata(back); !reflect.DeepEqual(got, want) {
		t.Errorf("collector JSON round trip differs")
	}
}
