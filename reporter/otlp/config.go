package otlp

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Defaults of Config, those of the OTLP exporter specification where it has one.
const (
	DefaultEndpoint     = "localhost:4317"
	DefaultTimeout      = 10 * time.Second
	DefaultQueueSize    = 30
	DefaultRetryInitial = time.Second
	DefaultRetryMax     = 30 * time.Second
	defaultPort         = "4317"
)

// Compression values of Config.
const (
	CompressionGzip = "gzip"
	CompressionNone = "none"
)

// Config says where and how to send profiles.
type Config struct {
	// Endpoint is the collector's OTLP/gRPC address: "host:port", "https://host:port",
	// or "http://host:port", which means plaintext whatever Insecure says.
	Endpoint string
	// Insecure sends in plaintext to a "host:port" endpoint instead of over TLS.
	Insecure bool
	// Headers are sent as gRPC metadata with every request, e.g. for authentication.
	Headers map[string]string
	// Timeout bounds each export call, and the last attempt to deliver at shutdown.
	Timeout time.Duration
	// CertFile is a PEM file of CAs to verify the collector with instead of the
	// system's; ClientCert and ClientKey, PEM files too, authenticate sonde (mTLS).
	CertFile, ClientCert, ClientKey string
	// Compression is CompressionGzip or CompressionNone. Profiles compress several
	// times over, so gzip is the default although OTLP's is none.
	Compression string
	// QueueSize is how many intervals wait while the collector is unreachable; when
	// one more comes, the oldest is dropped.
	QueueSize int
	// QueueBytes, when positive, bounds the encoded bytes of the waiting intervals too.
	QueueBytes int
	// RetryInitial and RetryMax bound the exponential backoff between attempts to
	// deliver to a collector that fails in a way worth retrying.
	RetryInitial, RetryMax time.Duration
}

// DefaultConfig returns the configuration used where nothing says otherwise.
func DefaultConfig() Config {
	return Config{
		Endpoint:     DefaultEndpoint,
		Timeout:      DefaultTimeout,
		Compression:  CompressionGzip,
		QueueSize:    DefaultQueueSize,
		RetryInitial: DefaultRetryInitial,
		RetryMax:     DefaultRetryMax,
	}
}

// ConfigFromEnv returns DefaultConfig overridden by the OTLP exporter environment
// variables, read through getenv (os.Getenv outside tests). Each
// OTEL_EXPORTER_OTLP_PROFILES_* variable takes precedence over its
// OTEL_EXPORTER_OTLP_* counterpart: ENDPOINT, INSECURE, HEADERS, TIMEOUT (ms),
// COMPRESSION, CERTIFICATE, CLIENT_CERTIFICATE and CLIENT_KEY.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	cfg := DefaultConfig()
	get := func(name string) (string, string) {
		specific := "OTEL_EXPORTER_OTLP_PROFILES_" + name
		if v := strings.TrimSpace(getenv(specific)); v != "" {
			return v, specific
		}
		generic := "OTEL_EXPORTER_OTLP_" + name
		return strings.TrimSpace(getenv(generic)), generic
	}
	var errs []error
	if v, _ := get("ENDPOINT"); v != "" {
		cfg.Endpoint = v
	}
	if v, name := get("INSECURE"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not a boolean", name, v))
		}
		cfg.Insecure = b
	}
	if v, name := get("HEADERS"); v != "" {
		h, err := parseKeyValues(v)
		if err != nil {
			// The value may hold secrets: name the variable, not its content.
			errs = append(errs, fmt.Errorf("%s: malformed header list", name))
		}
		cfg.Headers = h
	}
	if v, name := get("TIMEOUT"); v != "" {
		ms, err := strconv.ParseUint(v, 10, 32)
		if err != nil || ms == 0 {
			errs = append(errs, fmt.Errorf("%s: %q is not a positive number of milliseconds", name, v))
		} else {
			cfg.Timeout = time.Duration(ms) * time.Millisecond
		}
	}
	if v, name := get("COMPRESSION"); v != "" {
		switch c := strings.ToLower(v); c {
		case CompressionGzip, CompressionNone:
			cfg.Compression = c
		default:
			errs = append(errs, fmt.Errorf("%s: %q is neither gzip nor none", name, v))
		}
	}
	if v, _ := get("CERTIFICATE"); v != "" {
		cfg.CertFile = v
	}
	if v, _ := get("CLIENT_CERTIFICATE"); v != "" {
		cfg.ClientCert = v
	}
	if v, _ := get("CLIENT_KEY"); v != "" {
		cfg.ClientKey = v
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, fmt.Errorf("otlp environment: %w", err)
	}
	return cfg, nil
}

// target resolves Endpoint to a gRPC target and whether to use plaintext.
func (c Config) target() (addr string, plaintext bool, err error) {
	ep := strings.TrimSpace(c.Endpoint)
	if ep == "" {
		return "", false, errors.New("no endpoint")
	}
	plaintext = c.Insecure
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil {
			return "", false, fmt.Errorf("endpoint %q: %w", ep, err)
		}
		switch u.Scheme {
		case "http":
			plaintext = true
		case "https":
			plaintext = false
		default:
			return "", false, fmt.Errorf("endpoint %q: scheme %q is neither http nor https", ep, u.Scheme)
		}
		if u.Hostname() == "" {
			return "", false, fmt.Errorf("endpoint %q: no host", ep)
		}
		// gRPC has no use for a path: OTLP/gRPC ignores it.
		ep = u.Host
	}
	if _, _, err := net.SplitHostPort(ep); err != nil {
		ep = net.JoinHostPort(strings.Trim(ep, "[]"), defaultPort)
	}
	return ep, plaintext, nil
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Endpoint == "" {
		c.Endpoint = d.Endpoint
	}
	if c.Timeout <= 0 {
		c.Timeout = d.Timeout
	}
	if c.Compression == "" {
		c.Compression = d.Compression
	}
	if c.QueueSize <= 0 {
		c.QueueSize = d.QueueSize
	}
	if c.RetryInitial <= 0 {
		c.RetryInitial = d.RetryInitial
	}
	if c.RetryMax <= 0 {
		c.RetryMax = d.RetryMax
	}
	if c.RetryMax < c.RetryInitial {
		c.RetryMax = c.RetryInitial
	}
	return c
}

// Target is the address the exporter dials and whether it speaks plaintext, for other
// exporters that follow the profiles' configuration.
func (c Config) Target() (addr string, plaintext bool, err error) { return c.target() }

// TLS is the TLS configuration the exporter uses.
func (c Config) TLS() (*tls.Config, error) { return tlsConfig(c) }
