package e2e

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"

	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/trace"
)

// zstdMagic begins every zstd frame.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// viewFiles are the file exporters TestViewReadsCollectorFiles adds, by name, and what
// each file must begin with, so that the test knows it reads the form it means to.
var viewFiles = map[string]struct {
	settings string
	// starts checks the file's first bytes, with the exporter.file.nativeCompression
	// gate or without.
	starts func(b []byte, native bool) bool
}{
	"json": {"format: json", func(b []byte, _ bool) bool { return b[0] == '{' }},
	"proto_zstd": {"format: proto\ncompression: zstd", func(b []byte, native bool) bool {
		return native && bytes.HasPrefix(b, zstdMagic) || !native && bytes.HasPrefix(b[4:], zstdMagic)
	}},
	"json_zstd": {"format: json\ncompression: zstd", func(b []byte, native bool) bool {
		return native && bytes.HasPrefix(b, zstdMagic) || !native && bytes.HasPrefix(b[4:], zstdMagic)
	}},
	// With rotation the exporter writes each record straight to the file, and with
	// native compression compresses each into a frame of its own.
	"proto_zstd_rotation": {"format: proto\ncompression: zstd\nrotation:\n  max_megabytes: 10", func(b []byte, native bool) bool {
		return native && bytes.HasPrefix(b, zstdMagic) || !native && bytes.HasPrefix(b[4:], zstdMagic)
	}},
}

// sonde view reads every file a real Collector's file exporter writes, in every format
// and compression, as the profile sonde sent; the same profile written to sonde's own
// .otlp.pb is the reference.
func TestViewReadsCollectorFiles(t *testing.T) {
	bin := sondeBinary(t)
	p := fixture()
	ref := filepath.Join(t.TempDir(), "ref.otlp.pb")
	if err := otlp.WriteFile(ref, otlp.Encode([]*trace.Profile{p}, otlp.Resource{HostName: "e2e-host"}, otlp.EncodeOptions{Version: "e2e", Timestamps: true})); err != nil {
		t.Fatal(err)
	}
	want := viewFolded(t, bin, ref)
	if !strings.Contains(want, "main.handle") || !strings.Contains(want, "helper") {
		t.Fatalf("reference folded stacks lack the fixture's functions:\n%s", want)
	}

	for _, native := range []bool{false, true} {
		name := "per-message compression"
		opts := CollectorOptions{Files: map[string]string{}}
		if native {
			name = "native compression"
			opts.FeatureGates = []string{"exporter.file.nativeCompression"}
		}
		for n, f := range viewFiles {
			opts.Files[n] = f.settings
		}
		t.Run(name, func(t *testing.T) {
			c := StartCollectorWith(t, opts)
			send(t, c.Endpoint, p)
			c.WaitFor(t, 20*time.Second, func(m []*profilespb.ProfilesData) bool { return Summarize(m).Samples >= p.TotalCount() })
			// Stopping flushes every exporter and ends the compressed streams.
			if err := c.Stop(); err != nil {
				t.Fatal(err)
			}
			paths := map[string]string{"proto": c.Output}
			for n, path := range c.Files {
				paths[n] = path
			}
			for n, path := range paths {
				b, err := os.ReadFile(path)
				if err != nil || len(b) < 8 {
					t.Errorf("%s: the collector wrote %d bytes: %v", n, len(b), err)
					continue
				}
				if f, ok := viewFiles[n]; ok && !f.starts(b, native) {
					t.Errorf("%s: the collector's file begins %x, not in the form the test means to read", n, b[:8])
				}
				if n == "proto" && (b[0] != 0 || binary.BigEndian.Uint32(b) > uint32(len(b)-4)) {
					t.Errorf("proto: the collector's file begins %x, not with a record's length", b[:8])
				}
				if got := viewFolded(t, bin, path); got != want {
					t.Errorf("%s: sonde view read\n%s\nwant, as from sonde's own .otlp.pb:\n%s", n, got, want)
				}
			}
			// And the filters work on what came through the collector.
			out, err := exec.Command(bin, "view", "--pid", "4343", c.Files["proto_zstd"]).CombinedOutput()
			if err != nil || !strings.HasPrefix(string(out), "5 samples (") || !strings.Contains(string(out), "main.handle") || strings.Contains(string(out), "helper") {
				t.Errorf("sonde view --pid 4343: %v\n%s", err, out)
			}
		})
	}
}

// viewFolded runs sonde view on path and returns the folded stacks it writes, after
// checking the top table's sample count.
func viewFolded(t *testing.T, bin, path string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "view.folded")
	stdout, err := exec.Command(bin, "view", path, "--output", out).CombinedOutput()
	if err != nil {
		t.Errorf("sonde view %s: %v\n%s", path, err, stdout)
		return ""
	}
	if !strings.HasPrefix(string(stdout), "10 samples (") {
		t.Errorf("sonde view %s printed, want the fixture's 10 samples:\n%s", path, stdout)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
