package deploy

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// TestImageLayout reads bin/image (make image) and checks that it is a valid OCI
// layout of one image whose only file is the binary make build made.
func TestImageLayout(t *testing.T) {
	binary := requireBinary(t)
	dir := filepath.Join(root, "bin/image")
	if _, err := os.Stat(dir); err != nil {
		testenv.Unavailable(t, "no %s: run make image (make test-deploy does)", dir)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].MediaType != types.OCIManifestSchema1 {
		t.Fatalf("index %+v: want one OCI image manifest", im.Manifests)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	// Validate recomputes every digest and size against the blobs.
	if err := validate.Image(img); err != nil {
		t.Fatalf("invalid image: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || !slices.Equal(cf.Config.Entrypoint, []string{"/usr/bin/sonde"}) {
		t.Errorf("config: os %q arch %q entrypoint %v, want linux amd64 [/usr/bin/sonde]", cf.OS, cf.Architecture, cf.Config.Entrypoint)
	}
	files := imageFiles(t, img)
	want := readFile(t, binary)
	if !bytes.Equal(files["usr/bin/sonde"], want) {
		t.Errorf("usr/bin/sonde in the image (%d bytes) is not bin/sonde (%d bytes)", len(files["usr/bin/sonde"]), len(want))
	}
	delete(files, "usr/bin/sonde")
	if len(files) > 0 {
		t.Errorf("the image holds more than the binary: %v", keys(files))
	}

	// The tarball holds the same configuration, which names the layer by its
	// uncompressed digest; its manifest is docker's, made up on load, so the image
	// digests differ.
	tb, err := tarball.ImageFromPath(filepath.Join(root, "bin/sonde-image.tar"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c1, _ := img.ConfigName()
	if c2, err := tb.ConfigName(); err != nil || c1 != c2 {
		t.Errorf("tarball's image configuration %v (%v), layout's %v", c2, err, c1)
	}
}

// TestImageReproducible builds the image twice from the same binary: same digest.
func TestImageReproducible(t *testing.T) {
	binary := requireBinary(t)
	var digests []string
	for range 2 {
		out := filepath.Join(t.TempDir(), "image")
		cmd := exec.Command("go", "run", ".", "-binary", binary, "-layout", out)
		cmd.Dir = filepath.Join(root, "deploy/image")
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("mkimage: %v\n%s", err, b)
		}
		digests = append(digests, string(bytes.Fields(b)[1]))
	}
	if digests[0] != digests[1] {
		t.Errorf("two builds of one binary: %s and %s", digests[0], digests[1])
	}
}

// imageFiles reads the image's flattened file system: regular files by path.
func imageFiles(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeDir {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
