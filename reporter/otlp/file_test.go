package otlp

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/profiles/v1development"
	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/trace"
)

func TestMarshalJSONHexIDs(t *testing.T) {
	req := Encode([]*trace.Profile{newFixture().profile}, testHost, EncodeOptions{Version: "1.0"})
	b, err := MarshalJSON(req)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.ContainsRune(b, '\n') {
		t.Errorf("OTLP/JSON files hold one message per line; got a newline inside")
	}
	var doc struct {
		ResourceProfiles []struct {
			ScopeProfiles []struct {
				Profiles []struct {
					ProfileID    string `json:"profileId"`
					TimeUnixNano string `json:"timeUnixNano"`
				} `json:"profiles"`
			} `json:"scopeProfiles"`
		} `json:"resourceProfiles"`
		Dictionary struct {
			StringTable []string `json:"stringTable"`
			LinkTable   []struct {
				TraceID string `json:"traceId"`
				SpanID  string `json:"spanId"`
			} `json:"linkTable"`
		} `json:"dictionary"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("invalid JSON: %v", err)
	}
	want := hex.EncodeToString(req.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].ProfileId)
	got := doc.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].ProfileID
	if got != want {
		t.Errorf("profileId = %q, want hex %q", got, want)
	}
	if l := doc.Dictionary.LinkTable[0]; l.TraceID != strings.Repeat("0", 32) || l.SpanID != strings.Repeat("0", 16) {
		t.Errorf("link IDs = %q/%q, want hex zeros", l.TraceID, l.SpanID)
	}
	if doc.Dictionary.StringTable[0] != "" || len(doc.Dictionary.StringTable) < 10 {
		t.Errorf("stringTable = %q", doc.Dictionary.StringTable)
	}
	if doc.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].TimeUnixNano == "" {
		t.Errorf("timeUnixNano missing: field names are not lowerCamelCase?")
	}
}

func TestMarshalJSONLeavesStringsAlone(t *testing.T) {
	// A string that looks like an ID field must survive untouched.
	f := newFixture()
	f.profile.Samples[0].ThreadName = `"profileId":"AAAA"`
	req := Encode([]*trace.Profile{f.profile}, testHost, EncodeOptions{})
	b, err := MarshalJSON(req)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`\"profileId\":\"AAAA\"`)) {
		t.Errorf("string content rewritten: %s", b)
	}
}

func TestWriteFile(t *testing.T) {
	req := Encode([]*trace.Profile{newFixture().profile}, testHost, EncodeOptions{})
	dir := t.TempDir()

	pb := filepath.Join(dir, "interval.otlp.pb")
	if err := WriteFile(pb, req); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(pb)
	if err != nil {
		t.Fatal(err)
	}
	var pd profilespb.ProfilesData
	if err := proto.Unmarshal(raw, &pd); err != nil {
		t.Fatal(err)
	}
	back := &collectorpb.ExportProfilesServiceRequest{ResourceProfiles: pd.ResourceProfiles, Dictionary: pd.Dictionary}
	if !proto.Equal(back, req) {
		t.Errorf("ProfilesData read back differs from the request")
	}
	// The same bytes a collector receives.
	wire, _ := proto.Marshal(req)
	if !bytes.Equal(raw, wire) {
		t.Errorf("file bytes differ from the request's wire bytes")
	}

	js := filepath.Join(dir, "interval.otlp.json")
	if err := WriteFile(js, req); err != nil {
		t.Fatal(err)
	}
	raw, err = os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(bytes.TrimSpace(raw)) || !bytes.HasSuffix(raw, []byte("\n")) {
		t.Errorf("JSON file is not one JSON line")
	}

	if err := WriteFile(filepath.Join(dir, "interval.pprof"), req); err == nil {
		t.Errorf("unknown extension accepted")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("directory holds %d entries, want the 2 files and no temporaries", len(entries))
	}
}
