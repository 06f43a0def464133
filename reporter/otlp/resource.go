package otlp

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sort"
	"strings"
)

// Resource describes the host every profile comes from. Encode adds it to each
// process's resource, so one agent's processes can be told apart from another's.
type Resource struct {
	HostName string
	// HostID is the machine ID (/etc/machine-id), stable across reboots and renames.
	HostID string
	// Attributes come from OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME. They
	// override the detected host attributes of the same key, but not the process ones.
	Attributes map[string]string
}

// machineIDPaths are where systemd and, on older systems, D-Bus keep the machine ID.
var machineIDPaths = []string{"/etc/machine-id", "/var/lib/dbus/machine-id"}

// ResourceFromEnv detects the host and reads the OpenTelemetry resource variables
// through getenv (os.Getenv outside tests). A malformed OTEL_RESOURCE_ATTRIBUTES is
// ignored as a whole, as the OpenTelemetry specification asks, and reported in the
// error next to a Resource that is usable all the same.
func ResourceFromEnv(getenv func(string) string) (Resource, error) {
	var r Resource
	var errs []error
	if h, err := os.Hostname(); err == nil {
		r.HostName = h
	} else {
		errs = append(errs, fmt.Errorf("host name: %w", err))
	}
	for _, p := range machineIDPaths {
		if b, err := os.ReadFile(p); err == nil {
			if id := string(bytes.TrimSpace(b)); id != "" {
				r.HostID = id
				break
			}
		}
	}
	attrs, err := ParseResourceAttributes(getenv("OTEL_RESOURCE_ATTRIBUTES"))
	if err != nil {
		errs = append(errs, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err))
		attrs = nil
	}
	if name := strings.TrimSpace(getenv("OTEL_SERVICE_NAME")); name != "" {
		if attrs == nil {
			attrs = make(map[string]string, 1)
		}
		// The specification gives OTEL_SERVICE_NAME precedence over the list.
		attrs["service.name"] = name
	}
	r.Attributes = attrs
	return r, errors.Join(errs...)
}

// ParseResourceAttributes parses OTEL_RESOURCE_ATTRIBUTES: comma-separated key=value
// pairs whose keys and values may be percent-encoded.
func ParseResourceAttributes(s string) (map[string]string, error) {
	return parseKeyValues(s)
}

// parseKeyValues parses the k=v,k2=v2 lists of OTEL_RESOURCE_ATTRIBUTES and
// OTEL_EXPORTER_OTLP_HEADERS.
func parseKeyValues(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := make(map[string]string)
	for _, pair := range strings.Split(s, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not key=value", pair)
		}
		key, err := url.PathUnescape(strings.TrimSpace(k))
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", k, err)
		}
		if key == "" {
			return nil, fmt.Errorf("%q has an empty key", pair)
		}
		val, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("value of %q: %w", key, err)
		}
		out[key] = val
	}
	return out, nil
}

// sortedKeys returns m's keys in order, so encoded resources are reproducible.
func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
