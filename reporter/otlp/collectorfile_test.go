package otlp

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sonde-profiler/sonde/trace"
)

// record frames b as the file exporter's exportMessageAsBuffer does: its length as 4
// bytes big-endian, then b.
func record(b []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

// perMessage compresses b alone, as the exporter's codec.go does with compression zstd.
func perMessage(t testing.TB, b []byte) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}

// nativeStream compresses chunks as one stream, ending a frame after each chunk as the
// exporter's compressingWriter does at every flush without rotation.
func nativeStream(t testing.TB, chunks ...[]byte) []byte {
	t.Helper()
	var out bytes.Buffer
	enc, err := zstd.NewWriter(&out)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chunks {
		if _, err := enc.Write(c); err != nil {
			t.Fatal(err)
		}
		if err := enc.Close(); err != nil {
			t.Fatal(err)
		}
		enc.Reset(&out)
	}
	return out.Bytes()
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// twoIntervals returns two profiles of consecutive intervals and their requests, one
// request each, as a collector receives them.
func twoIntervals(t testing.TB) (first, second *trace.Profile, protos, jsons [][]byte) {
	t.Helper()
	first = newFixture().profile
	second = newFixture().profile
	second.Start, second.End = first.End, first.End.Add(10*time.Second)
	second.Samples = second.Samples[1:]
	for _, p := range []*trace.Profile{first, second} {
		for _, s := range p.Samples {
			s.Timestamps = nil
		}
		req := Encode([]*trace.Profile{p}, testHost, EncodeOptions{Rand: zeroRand{}})
		b, err := proto.Marshal(profilesData(req))
		if err != nil {
			t.Fatal(err)
		}
		js, err := MarshalJSON(req)
		if err != nil {
			t.Fatal(err)
		}
		protos, jsons = append(protos, b), append(jsons, js)
	}
	return first, second, protos, jsons
}

// exporterForms is two requests in every form the Collector's file exporter writes.
func exporterForms(t testing.TB, protos, jsons [][]byte) map[string][]byte {
	p1, p2, j1, j2 := protos[0], protos[1], jsons[0], jsons[1]
	// With rotation, native compression makes a frame of each record, and splits one
	// over the rotation size into several (writeChunkedFrames).
	r2 := record(p2)
	half := len(r2) / 2
	return map[string][]byte{
		"json":               cat(j1, []byte("\n"), j2, []byte("\n")),
		"proto":              cat(record(p1), record(p2)),
		"proto zstd":         cat(record(perMessage(t, p1)), record(perMessage(t, p2))),
		"json zstd":          cat(record(perMessage(t, j1)), record(perMessage(t, j2))),
		"proto native":       nativeStream(t, cat(record(p1), record(p2)[:7]), record(p2)[7:]),
		"json native":        nativeStream(t, cat(j1, []byte("\n")), cat(j2, []byte("\n"))),
		"proto native split": cat(perMessage(t, record(p1)), perMessage(t, r2[:half]), perMessage(t, r2[half:])),
	}
}

func TestDecodeFileExporterForms(t *testing.T) {
	first, second, protos, jsons := twoIntervals(t)
	for name, data := range exporterForms(t, protos, jsons) {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeFile(data)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 {
				t.Fatalf("%d profiles, want one per record (2)", len(got))
			}
			// The resource's attributes come back on the process: those the encoder
			// adds (service.name) and the host's, which the fixture's processes lack.
			if p := got[0].Samples[0].Process; p.Attributes["service.name"] != p.Name || p.Attributes["deployment.environment"] != "test" {
				t.Errorf("process attributes %v, want service.name=%s and the host's", p.Attributes, p.Name)
			}
			for i, want := range []*trace.Profile{first, second} {
				if g, w := describe(got[i]), describe(want); g != w {
					t.Errorf("interval %d:\ngot:\n%s\nwant:\n%s", i, g, w)
				}
			}
		})
	}
	// ReadFile takes them under sonde's names too.
	path := filepath.Join(t.TempDir(), "collector.otlp.pb")
	if err := os.WriteFile(path, exporterForms(t, protos, jsons)["proto zstd"], 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadFile(path); err != nil || len(got) != 2 {
		t.Errorf("ReadFile of the exporter's records: %d profiles, %v", len(got), err)
	}
}

// asCollectorWrites moves the attributes' keys and string values into the string table,
// as the Collector writes resource attributes it received inline.
func asCollectorWrites(pd *profilespb.ProfilesData) {
	d := pd.Dictionary
	intern := func(s string) int32 {
		d.StringTable = append(d.StringTable, s)
		return int32(len(d.StringTable) - 1)
	}
	inline := func(v *commonpb.AnyValue) {
		if x, ok := v.GetValue().(*commonpb.AnyValue_StringValue); ok {
			v.Value = &commonpb.AnyValue_StringValueStrindex{StringValueStrindex: intern(x.StringValue)}
		}
	}
	for _, rp := range pd.ResourceProfiles {
		for _, kv := range rp.Resource.Attributes {
			kv.KeyStrindex, kv.Key = intern(kv.Key), ""
			inline(kv.Value)
		}
	}
	for _, a := range d.AttributeTable {
		inline(a.Value)
	}
}

// What the Collector writes decodes as what sonde sent: processes and threads by the
// string table as well as inline.
func TestDecodeFileCollectorStrings(t *testing.T) {
	first, _, protos, _ := twoIntervals(t)
	var pd profilespb.ProfilesData
	if err := proto.Unmarshal(protos[0], &pd); err != nil {
		t.Fatal(err)
	}
	asCollectorWrites(&pd)
	b, err := proto.Marshal(&pd)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeFile(record(b))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || describe(got[0]) != describe(first) {
		t.Errorf("read back %d profiles:\n%s\nwant\n%s", len(got), describe(got[0]), describe(first))
	}
	pd.ResourceProfiles[0].Resource.Attributes[0].KeyStrindex = 9999
	if b, err = proto.Marshal(&pd); err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeFile(record(b)); err == nil || !strings.Contains(err.Error(), "record 1 at byte 0: resource 0: attribute key: string index 9999 outside its table") {
		t.Errorf("a key outside the string table: %v", err)
	}
}

// sonde's own single messages still read, also one whose first bytes, read as a length,
// are white space and a brace, and the exporter's records of 16 MiB and more, whose
// first byte is not zero.
func TestDecodeFileSingleAndLarge(t *testing.T) {
	first, _, protos, _ := twoIntervals(t)
	got, err := DecodeFile(protos[0])
	if err != nil || len(got) != 1 || describe(got[0]) != describe(first) {
		t.Fatalf("sonde's .otlp.pb: %d profiles, %v", len(got), err)
	}

	p := newFixture().profile
	huge := strings.Repeat("f", 17<<20)
	p.Samples[0].Locations[0].Lines[0].Function = huge
	b, err := proto.Marshal(profilesData(Encode([]*trace.Profile{p}, testHost, EncodeOptions{})))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"single": b, "record": record(b), "records": cat(record(b), record(protos[0]))} {
		if name != "single" && data[0] == 0 {
			t.Fatalf("%s: the record's length starts with a zero byte; the test wants one that does not", name)
		}
		got, err := DecodeFile(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var found bool
		for _, q := range got {
			for _, l := range q.Locations {
				found = found || len(l.Lines) > 0 && l.Lines[0].Function == huge
			}
		}
		if !found {
			t.Errorf("%s: the 17 MiB function name did not come through", name)
		}
	}

	// 0x0a 0x0a 0x0a 0x7b: a ProfilesData of one ResourceProfiles of 10 bytes, whose
	// Resource of 123 bytes does not fit: white space and a brace, then not JSON.
	if _, err := DecodeFile([]byte{0x0a, 0x0a, 0x0a, 0x7b}); err == nil || !strings.Contains(err.Error(), "OTLP/JSON line 4") || !strings.Contains(err.Error(), "nor as protobuf") {
		t.Errorf("white space and a brace, neither JSON nor protobuf: %v", err)
	}
}

// zstdHeader is a frame header of one segment claiming size bytes, and a last raw
// block of three.
func zstdHeader(size uint64) []byte {
	b := append([]byte{}, zstdMagic...)
	b = append(b, 0xe0) // 8-byte content size, single segment
	b = binary.LittleEndian.AppendUint64(b, size)
	h := uint32(3<<3 | 1)
	return append(b, byte(h), byte(h>>8), byte(h>>16), 'a', 'b', 'c')
}

// Cut, lying and hostile files give errors that say where, never a panic, and lengths
// that lie allocate nothing like what they claim.
func TestDecodeFileHostile(t *testing.T) {
	_, _, protos, _ := twoIntervals(t)
	good := record(protos[0])
	second := record(protos[1])
	at := func(n int) string { return " at byte " + strconv.Itoa(n) }
	itoa := strconv.Itoa
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"cut in a record", cat(good, second[:len(second)-10]), "record 2" + at(len(good)) + ": its length says " + itoa(len(protos[1])) + " bytes but " + itoa(len(protos[1])-10) + " follow: the file is cut short"},
		{"cut in a length", cat(good, []byte{0, 0}), "record 2" + at(len(good)) + ": only 2 of the 4 bytes of its length"},
		{"one byte", []byte{0}, "record 1 at byte 0: only 1 of the 4 bytes"},
		{"lying first length", []byte{0, 0xff, 0xff, 0xff, 1, 2, 3}, "record 1 at byte 0: its length says 16777215 bytes but 3 follow"},
		{"lying later length", cat(good, []byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3}), "record 2" + at(len(good)) + ": its length says 4294967295 bytes but 3 follow"},
		{"garbage record", record([]byte{0xff, 0xff, 0xff}), "record 1 at byte 0: proto"},
		{"cut zstd record", record(perMessage(t, protos[0])[:20]), "record 1 at byte 0: zstd: the compressed data is cut short"},
		{"zstd record of garbage", record(perMessage(t, []byte("not a profile"))), "record 1 at byte 0: proto"},
		{"zstd record claiming a huge size", record(zstdHeader(1 << 40)), "record 1 at byte 0: zstd: a frame asks for a buffer over the 33554432 bytes"},
		{"zstd record lying about its size", record(zstdHeader(1 << 24)), "record 1 at byte 0: zstd: "},
		{"native cut short", nativeStream(t, cat(good, second))[:40], "zstd: the compressed data is cut short"},
		{"native record cut short", nativeStream(t, cat(good, second[:len(second)-10])), "record 2" + at(len(good)) + " of the decompressed stream: its length says"},
		{"native length cut short", nativeStream(t, cat(good, []byte{0})), "record 2" + at(len(good)) + " of the decompressed stream: the stream ends inside its 4-byte length"},
		{"native lying length", nativeStream(t, []byte{0x7f, 0xff, 0xff, 0xff, 1, 2, 3}), "its length says 2147483647 bytes, more than the 1073741824 sonde reads"},
		{"native lying length within bounds", nativeStream(t, []byte{0x3f, 0xff, 0xff, 0xff, 1, 2, 3}), "its length says 1073741823 bytes but 3 follow"},
		{"native bad JSON", nativeStream(t, []byte("{\"x\n")), "OTLP/JSON line 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			got, err := DecodeFile(tc.data)
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Fatalf("no error; %d profiles", len(got))
			}
			if !strings.HasPrefix(err.Error(), "decode OTLP profiles: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to say %q", err, tc.want)
			}
			// The zstd decoder's buffers and the test's own garbage stay well under this.
			if n := after.TotalAlloc - before.TotalAlloc; n > 48<<20 {
				t.Errorf("allocated %d MiB", n>>20)
			}
		})
	}
}

// Data that decompresses past the bounds is refused, whatever its framing claims.
func TestDecodeFileBombs(t *testing.T) {
	defer func(r, f int64) { maxRecordBytes, maxInflateBytes = r, f }(maxRecordBytes, maxInflateBytes)
	maxRecordBytes, maxInflateBytes = 1<<20, 3<<20
	zeros := make([]byte, 2<<20)
	// A ProfilesData of 1 MiB, an unknown field of zeros, valid as a record.
	mib := protowire.AppendBytes(protowire.AppendTag(nil, 1000, protowire.BytesType), zeros[:1<<20-8])
	line := append([]byte("{"), bytes.Repeat([]byte("a"), 2<<20)...)
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		// Zero-length records: nothing to allocate, only time to spend.
		{"native empty records", nativeStream(t, zeros, zeros), "the file decompresses to more than the 3145728 bytes sonde reads"},
		{"record over the bound", record(perMessage(t, zeros)), "record 1 at byte 0: zstd: the record decompresses to more than the 1048576 bytes"},
		{"records over the file's bound", bytes.Repeat(record(perMessage(t, mib)), 4), "record 4 at byte " + strconv.Itoa(3*len(record(perMessage(t, mib)))) + ": zstd: the file decompresses to more than the 3145728 bytes"},
		{"native JSON line over the bound", nativeStream(t, line), "OTLP/JSON line 1: longer than the 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeFile(tc.data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to say %q", err, tc.want)
			}
		})
	}
}

// FuzzDecodeFile: no input makes DecodeFile panic.
func FuzzDecodeFile(f *testing.F) {
	_, _, protos, jsons := twoIntervals(f)
	for _, data := range exporterForms(f, protos, jsons) {
		f.Add(data)
		f.Add(data[:len(data)/2])
	}
	f.Add(record(zstdHeader(1 << 20)))
	f.Fuzz(func(t *testing.T, data []byte) {
		profiles, err := DecodeFile(data)
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
