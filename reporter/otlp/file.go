package otlp

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/profiles/v1development"
	profilespb "go.opentelemetry.io/proto/otlp/profiles/v1development"
	"google.golang.org/protobuf/encoding/protojson"
)

// Write writes req as the OpenTelemetry Collector reads profiles from files: a binary
// ProfilesData message, or with json a line of OTLP/JSON (what the file exporter writes in
// JSON format and the otlpjsonfile receiver reads).
func Write(w io.Writer, json bool, req *collectorpb.ExportProfilesServiceRequest) error {
	var data []byte
	var err error
	if json {
		data, err = MarshalJSON(req)
		data = append(data, '\n')
	} else {
		data, err = MarshalRequest(req) // a request's bytes are its ProfilesData's
	}
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}

// IsJSON says whether a file name asks for OTLP/JSON (".otlp.json") rather than binary
// protobuf (".otlp.pb").
func IsJSON(name string) bool { return strings.HasSuffix(name, ".otlp.json") }

// WriteFile stores req at path, in the form its name asks for: ".otlp.pb" or
// ".otlp.json". The file is replaced atomically, so a reader never sees half of it, and
// is created with the mode the umask allows.
func WriteFile(path string, req *collectorpb.ExportProfilesServiceRequest) error {
	if !strings.HasSuffix(path, ".otlp.pb") && !IsJSON(path) {
		return fmt.Errorf("write %s: unknown format: the name must end in .otlp.pb or .otlp.json", path)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // after the rename this fails harmlessly
	if err := Write(tmp, IsJSON(path), req); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	// CreateTemp makes the file private; a file the user names gets what the umask gives.
	umask := syscall.Umask(0)
	syscall.Umask(umask)
	if err := os.Chmod(tmp.Name(), os.FileMode(0o666&^umask)); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// profilesData is the file form of a request: the same fields under the same
// numbers, so the bytes are those a collector would have received.
func profilesData(req *collectorpb.ExportProfilesServiceRequest) *profilespb.ProfilesData {
	return &profilespb.ProfilesData{ResourceProfiles: req.ResourceProfiles, Dictionary: req.Dictionary}
}

// idField matches the bytes fields that OTLP/JSON writes as hex. Inside a JSON string
// every quote is escaped, so the pattern cannot match string content, only keys.
var idField = regexp.MustCompile(`"(profileId|traceId|spanId)":\s*"([A-Za-z0-9+/=]*)"`)

// MarshalJSON encodes req as one line of OTLP/JSON ProfilesData. That is protojson
// with lowerCamelCase names, except that OTLP/JSON writes trace, span and profile IDs
// as hex where protojson writes bytes as base64.
func MarshalJSON(req *collectorpb.ExportProfilesServiceRequest) ([]byte, error) {
	b, err := protojson.Marshal(profilesData(req))
	if err != nil {
		return nil, fmt.Errorf("encode OTLP/JSON: %w", err)
	}
	var convErr error
	b = idField.ReplaceAllFunc(b, func(m []byte) []byte {
		sub := idField.FindSubmatch(m)
		raw, err := base64.StdEncoding.DecodeString(string(sub[2]))
		if err != nil {
			convErr = fmt.Errorf("encode OTLP/JSON: %s: %w", sub[1], err)
			return m
		}
		return fmt.Appendf(nil, `"%s":"%s"`, sub[1], hex.EncodeToString(raw))
	})
	if convErr != nil {
		return nil, convErr
	}
	return b, nil
}
