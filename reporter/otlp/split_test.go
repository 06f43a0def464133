package otlp

import (
	"bytes"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/trace"
)

func TestSplitSmallRequestUntouched(t *testing.T) {
	req := Encode([]*trace.Profile{newFixture().profile}, testHost, EncodeOptions{})
	parts := Split(req, MaxRequestBytes)
	if len(parts) != 1 || parts[0] != req {
		t.Fatalf("a small request was split into %d parts", len(parts))
	}
}

func TestSplitOverLimit(t *testing.T) {
	// One huge process (a single profile over the limit on its own) and a few
	// small ones, so both ways of splitting are needed.
	huge := synthetic(1, 1, 12000, 6000, 22, 900, t0)
	small := synthetic(2, 6, 3000, 600, 12, 0, t0)
	for _, s := range small.Samples {
		s.Process.PID += 5000 // distinct from the huge one's
	}
	req := Encode([]*trace.Profile{huge, small}, testHost, EncodeOptions{})
	size := proto.Size(req)
	if size <= 2*MaxRequestBytes {
		t.Fatalf("synthetic request is only %d bytes; the test needs one over %d", size, 2*MaxRequestBytes)
	}
	parts := Split(req, MaxRequestBytes)
	t.Logf("%d bytes in %d parts", size, len(parts))
	if len(parts) < 3 {
		t.Errorf("got %d parts for %d bytes", len(parts), size)
	}
	var union []string
	ids := map[string]bool{}
	for i, p := range parts {
		if n := proto.Size(p); n > MaxRequestBytes {
			t.Errorf("part %d is %d bytes, over %d", i, n, MaxRequestBytes)
		}
		checkDictionary(t, p)
		union = append(union, canonicalSamples(p)...)
		for _, rp := range p.ResourceProfiles {
			for _, sp := range rp.ScopeProfiles {
				for _, pr := range sp.Profiles {
					if ids[string(pr.ProfileId)] {
						t.Errorf("part %d repeats profile ID %x", i, pr.ProfileId)
					}
					ids[string(pr.ProfileId)] = true
				}
			}
		}
	}
	slices.Sort(union)
	want := canonicalSamples(req)
	if !slices.Equal(union, want) {
		t.Errorf("parts hold %d samples, the request %d, or they differ", len(union), len(want))
	}
	// The small processes are not cut up: each lies in one part.
	where := map[any]int{}
	for i, p := range parts {
		for _, rp := range p.ResourceProfiles {
			pid, _ := resourceAttr(rp, keyProcessPID)
			if pid.(int64) < 5000 {
				continue
			}
			if j, ok := where[pid]; ok && j != i {
				t.Errorf("small process %v split over parts %d and %d", pid, j, i)
			}
			where[pid] = i
		}
	}
}

func TestSplitDownToSingleSamples(t *testing.T) {
	req := Encode([]*trace.Profile{newFixture().profile}, testHost, EncodeOptions{})
	// A tiny limit forces a split into single samples.
	parts := Split(req, 1)
	var n int
	for _, p := range parts {
		checkDictionary(t, p)
		n += len(canonicalSamples(p))
	}
	if n != len(canonicalSamples(req)) {
		t.Errorf("got %d samples back, want %d", n, len(canonicalSamples(req)))
	}
	// The first part of a split profile keeps its ID.
	first := req.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].ProfileId
	if got := parts[0].ResourceProfiles[0].ScopeProfiles[0].Profiles[0].ProfileId; !bytes.Equal(got, first) {
		t.Errorf("first part's profile ID %x, want %x", got, first)
	}
}
