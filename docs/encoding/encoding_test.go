package encoding

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
)

// The fixtures of docs/encoding.md, captured by testdata/capture.sh.
var corpusNames = []string{"average", "deep", "large"}

var (
	corporaOnce sync.Once
	corpora     []*Corpus
	corporaErr  error
)

// loadCorpora loads every fixture once per test binary.
func loadCorpora(tb testing.TB) []*Corpus {
	tb.Helper()
	corporaOnce.Do(func() {
		for _, n := range corpusNames {
			c, err := Load("testdata/" + n + ".otlp.pb.gz")
			if err != nil {
				corporaErr = err
				return
			}
			corpora = append(corpora, c)
		}
	})
	if corporaErr != nil {
		tb.Fatal(corporaErr)
	}
	return corpora
}

func TestRoundTrip(t *testing.T) {
	codecs := append(Codecs(), ChunkedCodec(4, 64), ChunkedCodec(16, 16384), ChunkedCodec(3, 1))
	for _, c := range loadCorpora(t) {
		for _, codec := range codecs {
			t.Run(c.Name+"/"+codec.Name, func(t *testing.T) {
				enc := codec.New()
				// Twice through one encoder: state left from a request must not leak
				// into the next.
				for range 2 {
					b, err := enc.Encode(c)
					if err != nil {
						t.Fatal(err)
					}
					d, err := codec.Decode(b)
					if err != nil {
						t.Fatal(err)
					}
					got, err := d.Samples()
					if err != nil {
						t.Fatal(err)
					}
					if err := Equal(c, got); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// The protowire stack table must be byte for byte what the generated code writes, or
// the comparison between them measures something else; so must the envelope the
// experimental encoders share with it.
func TestStackTableWireMatchesGenerated(t *testing.T) {
	for _, c := range loadCorpora(t) {
		a, err := StackTableCodec().New().Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		b, err := StackTableWireCodec().New().Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s: protowire stack table differs from proto.Marshal: %d vs %d bytes", c.Name, len(b), len(a))
		}
	}
}

// foldedCorpus builds a corpus from folded stacks ("root;...;leaf count"), one
// location and function per distinct frame name.
func foldedCorpus(t *testing.T, folded ...string) *Corpus {
	t.Helper()
	dict := &profilespb.ProfilesDictionary{
		MappingTable:  []*profilespb.Mapping{{}},
		LocationTable: []*profilespb.Location{{}},
		FunctionTable: []*profilespb.Function{{}},
		StringTable:   []string{""},
		StackTable:    []*profilespb.Stack{{}},
	}
	locs := map[string]int32{}
	prof := &profilespb.Profile{}
	for _, line := range folded {
		frames, count, ok := strings.Cut(line, " ")
		n, err := strconv.ParseInt(count, 10, 64)
		if !ok || err != nil {
			t.Fatalf("bad folded line %q", line)
		}
		var stack []int32
		names := strings.Split(frames, ";")
		for i := len(names) - 1; i >= 0; i-- {
			l, ok := locs[names[i]]
			if !ok {
				dict.StringTable = append(dict.StringTable, names[i])
				dict.FunctionTable = append(dict.FunctionTable, &profilespb.Function{NameStrindex: int32(len(dict.StringTable) - 1)})
				dict.LocationTable = append(dict.LocationTable, &profilespb.Location{
					Address: uint64(0x1000 * len(dict.LocationTable)),
					Lines:   []*profilespb.Line{{FunctionIndex: int32(len(dict.FunctionTable) - 1)}},
				})
				l = int32(len(dict.LocationTable) - 1)
				locs[names[i]] = l
			}
			stack = append(stack, l)
		}
		dict.StackTable = append(dict.StackTable, &profilespb.Stack{LocationIndices: stack})
		prof.Samples = append(prof.Samples, &profilespb.Sample{StackIndex: int32(len(dict.StackTable) - 1), Values: []int64{n}})
	}
	c, err := FromProfilesData("folded", &profilespb.ProfilesData{
		Dictionary: dict,
		ResourceProfiles: []*profilespb.ResourceProfiles{{
			ScopeProfiles: []*profilespb.ScopeProfiles{{Profiles: []*profilespb.Profile{prof}}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The discussion's example: the layouts must share what they claim to share.
func TestDiscussionExample(t *testing.T) {
	c := foldedCorpus(t, "foo;bar;baz 100", "abc;def 200", "foo;bar 300", "abc;ghi 400", "foo;bar;qux 500")

	s := SlicesCodec().New().(*slicesEncoder)
	if _, err := s.Encode(c); err != nil {
		t.Fatal(err)
	}
	// foo;bar is the tail of foo;bar;baz, so only four stacks are written.
	if want := 3 + 2 + 2 + 3; len(s.li) != want || s.hits != 1 {
		t.Errorf("slices: %d location indices, %d reused stacks; want %d, 1", len(s.li), s.hits, want)
	}

	k := ChunkedCodec(2, 16).New().(*chunkedEncoder)
	if _, err := k.Encode(c); err != nil {
		t.Fatal(err)
	}
	// Chunks of two from the root: [baz] [bar foo], [def abc], [bar foo] again,
	// [ghi abc], [qux] [bar foo] again; a new stack is one reference, the last two.
	if len(k.li) != 8 || k.hits != 2 || k.nrefs != 6 {
		t.Errorf("chunked: %d location indices, %d chunks reused, %d references; want 8, 2, 6", len(k.li), k.hits, k.nrefs)
	}

	tree := CalltreeCodec(false).New().(*calltreeEncoder)
	if _, err := tree.Encode(c); err != nil {
		t.Fatal(err)
	}
	// The root and one node per distinct call path: foo, bar, baz, abc, def, ghi, qux.
	if len(tree.parents) != 8 {
		t.Errorf("calltree: %d nodes, want 8", len(tree.parents))
	}

	for _, codec := range Codecs() {
		b, err := codec.New().Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		d, err := codec.Decode(b)
		if err != nil {
			t.Fatalf("%s: %v", codec.Name, err)
		}
		got, err := d.Samples()
		if err != nil {
			t.Fatalf("%s: %v", codec.Name, err)
		}
		if err := Equal(c, got); err != nil {
			t.Errorf("%s: %v", codec.Name, err)
		}
	}
}

// Truncated messages must fail or decode to something, never panic.
func TestDecodeTruncated(t *testing.T) {
	c := foldedCorpus(t, "foo;bar;baz 100", "abc;def 200", "foo;bar 300", "abc;ghi 400", "foo;bar;qux 500")
	for _, codec := range Codecs() {
		b, err := codec.New().Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		b = append([]byte(nil), b...)
		for n := range len(b) {
			d, err := codec.Decode(b[:n])
			if err == nil {
				d.Samples() // may fail; must not panic
			}
		}
	}
}

func TestSimulateKernel(t *testing.T) {
	// One stack, 16 frames, seen three times: chunks of 8 are sent in full once, then as
	// hashes only.
	stack := make([]string, 16)
	for i := range stack {
		stack[i] = fmt.Sprintf("f%d", i)
	}
	c := foldedCorpus(t, strings.Join(stack, ";")+" 3")
	r, err := SimulateKernel(c, DefaultKernelModel, 8, 4, 10)
	if err != nil {
		t.Fatal(err)
	}
	today := int64(3 * (48 + 16*8))
	proposed := int64(48+2*8+16*8) + 2*int64(48+2*8)
	if r.Events != 3 || r.Today != today || r.Proposed != proposed || r.DeepEvents != 3 {
		t.Errorf("got %+v; want 3 events, %d bytes today, %d proposed", r, today, proposed)
	}
}
