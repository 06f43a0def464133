package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BinaryPath is where the image holds sonde; the entrypoint runs it.
const BinaryPath = "/usr/bin/sonde"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	binary := fs.String("binary", "bin/sonde", "the static sonde `binary` to put in the image")
	out := fs.String("layout", "bin/image", "write an OCI image layout to this `directory` (replaced)")
	tarPath := fs.String("tar", "", "also write a docker-load tarball to this `file`")
	ref := fs.String("tag", "ghcr.io/sonde-profiler/sonde:dev", "the image's `reference`, for the tarball and the layout's ref.name")
	version := fs.String("version", "dev", "the image's version annotation")
	if err := fs.Parse(args); err != nil {
		return err
	}
	epoch, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	img, err := build(*binary, *version, epoch)
	if err != nil {
		return err
	}
	tag, err := name.NewTag(*ref)
	if err != nil {
		return fmt.Errorf("--tag %q: %w", *ref, err)
	}
	if err := os.RemoveAll(*out); err != nil {
		return fmt.Errorf("replace %s: %w", *out, err)
	}
	p, err := layout.Write(*out, empty.Index)
	if err != nil {
		return fmt.Errorf("write layout %s: %w", *out, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.TagStr(),
	})); err != nil {
		return fmt.Errorf("write layout %s: %w", *out, err)
	}
	if *tarPath != "" {
		if err := tarball.WriteToFile(*tarPath, tag, img); err != nil {
			return fmt.Errorf("write tarball %s: %w", *tarPath, err)
		}
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s\n", *out, digest)
	return nil
}

// sourceDateEpoch is the image's one timestamp: SOURCE_DATE_EPOCH if set, else the
// Unix epoch, so that rebuilding the same binary gives the same digest.
func sourceDateEpoch() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
	}
	return time.Unix(n, 0).UTC(), nil
}

func build(binary, version string, epoch time.Time) (v1.Image, error) {
	b, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	arch, err := architecture(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", binary, err)
	}
	layerTar, err := layerTar(b, epoch)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "mkimage: " + BinaryPath, Comment: "the static sonde binary"},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = arch, "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = []string{BinaryPath}
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   "sonde",
		"org.opencontainers.image.source":  "https://github.com/sonde-profiler/sonde",
		"org.opencontainers.image.version": version,
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	return mutate.Annotations(img, map[string]string{
		"org.opencontainers.image.version": version,
		"org.opencontainers.image.created": epoch.Format(time.RFC3339),
	}).(v1.Image), nil
}

// architecture names the binary's GOARCH in OCI's words, so the configuration cannot
// claim another.
func architecture(b []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return "", fmt.Errorf("not an ELF file: %w", err)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return "", errors.New("not an executable")
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", errors.New("dynamically linked; the image has no libc: build with CGO_ENABLED=0")
		}
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	default:
		return "", fmt.Errorf("architecture %v not supported", f.Machine)
	}
}

// layerTar holds usr/, usr/bin/ and usr/bin/sonde, owned by root, dated epoch.
func layerTar(binary []byte, epoch time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, dir := range []string{"usr/", "usr/bin/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: BinaryPath[1:], Mode: 0o755, Size: int64(len(binary)), ModTime: epoch, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(binary); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
