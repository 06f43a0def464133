package otlp

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/trace"
)

// describe prints what a profile says, one sorted line per sample, by value.
func describe(p *trace.Profile) string {
	var lines []string
	for _, s := range p.Samples {
		var b strings.Builder
		if s.Process != nil {
			// The resource's other attributes come back too, with the host's and what the
			// encoder adds (TestDecodeFileExporterForms checks them): the process is
			// compared by what identifies it.
			p := *s.Process
			p.Attributes, p.Published = nil, nil
			fmt.Fprintf(&b, "%+v ", p)
		}
		fmt.Fprintf(&b, "tid=%d %q count=%d ts=%d:", s.TID, s.ThreadName, s.Count, len(s.Timestamps))
		for _, l := range s.Locations {
			fmt.Fprintf(&b, " [%v %#x %s %v", l.Kind, l.Address, l.NameSource, l.Lines)
			if m := l.Mapping; m != nil {
				fmt.Fprintf(&b, " %s %#x-%#x@%#x", m.Path, m.Start, m.End, m.Offset)
				if f := m.File; f != nil {
					fmt.Fprintf(&b, " gnu=%s go=%s htl=%s", f.GNUBuildID, f.GoBuildID, f.HTLHash)
				}
			}
			b.WriteString("]")
		}
		lines = append(lines, b.String())
	}
	slices.Sort(lines)
	return fmt.Sprintf("%v..%v period %v\n%s", p.Start.UTC(), p.End.UTC(), p.Period, strings.Join(lines, "\n"))
}

func TestDecodeUndoesEncode(t *testing.T) {
	first := newFixture().profile
	second := newFixture().profile
	second.Start, second.End = first.End, first.End.Add(10*time.Second)
	second.Samples = second.Samples[1:]
	for _, s := range first.Samples {
		s.Timestamps = nil // the timestamped form is checked below
	}
	req := Encode([]*trace.Profile{first, second}, testHost, EncodeOptions{Rand: zeroRand{}})
	bin, err := proto.Marshal(profilesData(req))
	if err != nil {
		t.Fatal(err)
	}
	js, err := MarshalJSON(req)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		data []byte
		json bool
	}{
		"binary": {bin, false},
		"json":   {js, true},
		// The collector's file exporter appends one line per request.
		"json lines": {append(append(append([]byte(nil), js...), '\n'), js...), true},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Decode(tc.data, tc.json)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 {
				t.Fatalf("%d profiles, want one per interval (2)", len(got))
			}
			times := 1
			if name == "json lines" {
				times = 2
			}
			for i, want := range []*trace.Profile{first, second} {
				w := describe(want)
				if times == 2 {
					want.Samples = append(want.Samples, want.Samples...)
					w = describe(want)
					want.Samples = want.Samples[:len(want.Samples)/2]
				}
				if g := describe(got[i]); g != w {
					t.Errorf("interval %d:\ngot:\n%s\nwant:\n%s", i, g, w)
				}
			}
			// Every location a sample uses is listed once.
			for _, p := range got {
				listed := map[*trace.Location]int{}
				for _, l := range p.Locations {
					listed[l]++
				}
				for _, s := range p.Samples {
					for _, l := range s.Locations {
						if listed[l] != 1 {
							t.Errorf("location %+v listed %d times", l, listed[l])
						}
					}
				}
			}
		})
	}
}

func TestDecodeTimestamps(t *testing.T) {
	p := newFixture().profile
	req := Encode([]*trace.Profile{p}, testHost, EncodeOptions{Rand: zeroRand{}, Timestamps: true})
	bin, err := proto.Marshal(profilesData(req))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(bin, false)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, s := range got[0].Samples {
		if s.TID == 100 {
			found = true
			if s.Count != 3 || len(s.Timestamps) != 3 || !s.Timestamps[1].Equal(t0.Add(2*time.Second)) {
				t.Errorf("timestamped sample: count %d, timestamps %v", s.Count, s.Timestamps)
			}
		}
	}
	if !found {
		t.Error("no sample of thread 100")
	}
}

func TestReadFileUndoesWriteFile(t *testing.T) {
	p := newFixture().profile
	p.Samples[0].Timestamps = nil // not sent without EncodeOptions.Timestamps
	req := Encode([]*trace.Profile{p}, testHost, EncodeOptions{})
	for _, name := range []string{"p.otlp.pb", "p.otlp.json"} {
		path := filepath.Join(t.TempDir(), name)
		if err := WriteFile(path, req); err != nil {
			t.Fatal(err)
		}
		got, err := ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 {
			t.Fatalf("%s: read back %d profiles, want 1", name, len(got))
		}
		if g, w := describe(got[0]), describe(p); g != w {
			t.Errorf("%s: read back\n%s\nwant\n%s", name, g, w)
		}
	}
	if _, err := ReadFile("x.pb.gz"); err == nil || !strings.Contains(err.Error(), "unknown format") {
		t.Errorf("ReadFile of a pprof name: %v", err)
	}
}

func TestDecodeCorrupt(t *testing.T) {
	good := func() *profilespb.ProfilesData {
		return profilesData(Encode([]*trace.Profile{newFixture().profile}, testHost, EncodeOptions{Rand: zeroRand{}}))
	}
	for name, corrupt := range map[string]func(pd *profilespb.ProfilesData){
		"stack index": func(pd *profilespb.ProfilesData) {
			pd.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].Samples[0].StackIndex = 1000
		},
		"negative location": func(pd *profilespb.ProfilesData) {
			pd.Dictionary.StackTable[1].LocationIndices[0] = -1
		},
		"function index": func(pd *profilespb.ProfilesData) {
			pd.Dictionary.LocationTable[1].Lines = []*profilespb.Line{{FunctionIndex: 77}}
		},
		"string index": func(pd *profilespb.ProfilesData) {
			for _, f := range pd.Dictionary.FunctionTable[1:] {
				f.NameStrindex = 1 << 30
			}
		},
		"mapping index": func(pd *profilespb.ProfilesData) {
			for _, l := range pd.Dictionary.LocationTable[1:] {
				l.MappingIndex = 500
			}
		},
		"attribute index": func(pd *profilespb.ProfilesData) {
			pd.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].Samples[0].AttributeIndices = []int32{99}
		},
		"no dictionary": func(pd *profilespb.ProfilesData) { pd.Dictionary = nil },
	} {
		pd := good()
		corrupt(pd)
		data, err := proto.Marshal(pd)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Decode(data, false); err == nil || !strings.Contains(err.Error(), "outside its table") {
			t.Errorf("%s: error %v, want an index outside its table", name, err)
		}
	}
	for _, bad := range []string{"{", `{"resourceProfiles":[{"scopeProfiles":[{"profiles":[{"profileId":"abc"}]}]}]}`, "\x00\x01"} {
		if _, err := Decode([]byte(bad), true); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("Decode(%q, json): %v", bad, err)
		}
	}
	if _, err := Decode([]byte("\xff\xff\xff"), false); err == nil {
		t.Error("Decode of garbage protobuf: no error")
	}
}

// FuzzDecode: no input makes Decode panic, binary or JSON.
func FuzzDecode(f *testing.F) {
	req := Encode([]*trace.Profile{newFixture().profile}, testHost, EncodeOptions{Rand: zeroRand{}, Timestamps: true})
	bin, err := proto.Marshal(profilesData(req))
	if err != nil {
		f.Fatal(err)
	}
	js, err := MarshalJSON(req)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(bin, false)
	f.Add(js, true)
	f.Add([]byte(`{"resourceProfiles":[{"scopeProfiles":[{"profiles":[{"samples":[{"stackIndex":3}]}]}]}]}`), true)
	f.Fuzz(func(t *testing.T, data []byte, json bool) {
		profiles, err := Decode(data, json)
		if err != nil {
			return
		}
		for _, p := range profiles {
			for _, s := range p.Samples {
				for _, l := range s.Locations {
					if l == nil {
						t.Fatal("a sample holds a nil location")
					}
				}
			}
		}
	})
}
