package otlp

import (
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigFromEnv(t *testing.T) {
	for _, c := range []struct {
		name    string
		env     map[string]string
		want    func(*Config)
		wantErr string
	}{
		{name: "defaults", env: nil, want: func(*Config) {}},
		{
			name: "generic",
			env: map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT":           "https://collector:4317",
				"OTEL_EXPORTER_OTLP_HEADERS":            "api-key=s%20ecret, tenant=a",
				"OTEL_EXPORTER_OTLP_INSECURE":           "true",
				"OTEL_EXPORTER_OTLP_TIMEOUT":            "2500",
				"OTEL_EXPORTER_OTLP_COMPRESSION":        "none",
				"OTEL_EXPORTER_OTLP_CERTIFICATE":        "/ca.pem",
				"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/c.pem",
				"OTEL_EXPORTER_OTLP_CLIENT_KEY":         "/k.pem",
			},
			want: func(c *Config) {
				c.Endpoint = "https://collector:4317"
				c.Headers = map[string]string{"api-key": "s ecret", "tenant": "a"}
				c.Insecure = true
				c.Timeout = 2500 * time.Millisecond
				c.Compression = "none"
				c.CertFile, c.ClientCert, c.ClientKey = "/ca.pem", "/c.pem", "/k.pem"
			},
		},
		{
			name: "profiles-specific wins",
			env: map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT":                    "generic:4317",
				"OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT":           "http://profiles:4317",
				"OTEL_EXPORTER_OTLP_HEADERS":                     "a=1",
				"OTEL_EXPORTER_OTLP_PROFILES_HEADERS":            "b=2",
				"OTEL_EXPORTER_OTLP_INSECURE":                    "true",
				"OTEL_EXPORTER_OTLP_PROFILES_INSECURE":           "false",
				"OTEL_EXPORTER_OTLP_TIMEOUT":                     "1000",
				"OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT":            "3000",
				"OTEL_EXPORTER_OTLP_CERTIFICATE":                 "/generic.pem",
				"OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE":        "/profiles.pem",
				"OTEL_EXPORTER_OTLP_PROFILES_CLIENT_CERTIFICATE": "/pc.pem",
				"OTEL_EXPORTER_OTLP_PROFILES_CLIENT_KEY":         "/pk.pem",
			},
			want: func(c *Config) {
				c.Endpoint = "http://profiles:4317"
				c.Headers = map[string]string{"b": "2"}
				c.Insecure = false
				c.Timeout = 3 * time.Second
				c.CertFile, c.ClientCert, c.ClientKey = "/profiles.pem", "/pc.pem", "/pk.pem"
			},
		},
		{name: "bad insecure", env: map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "yes please"}, wantErr: "OTEL_EXPORTER_OTLP_INSECURE"},
		{name: "bad timeout", env: map[string]string{"OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT": "10s"}, wantErr: "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT"},
		{name: "bad compression", env: map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, wantErr: "neither gzip nor none"},
		{name: "bad headers", env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "secret-without-equals"}, wantErr: "malformed header list"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ConfigFromEnv(env(c.env))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error = %v, want one mentioning %q", err, c.wantErr)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Errorf("error leaks a header value: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := DefaultConfig()
			c.want(&want)
			if !maps.Equal(got.Headers, want.Headers) {
				t.Errorf("headers = %v, want %v", got.Headers, want.Headers)
			}
			got.Headers, want.Headers = nil, nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("config = %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestConfigTarget(t *testing.T) {
	for _, c := range []struct {
		endpoint  string
		insecure  bool
		addr      string
		plaintext bool
		err       bool
	}{
		{endpoint: "collector:4317", addr: "collector:4317"},
		{endpoint: "collector:4317", insecure: true, addr: "collector:4317", plaintext: true},
		{endpoint: "collector", addr: "collector:4317"},
		{endpoint: "http://collector:5000", addr: "collector:5000", plaintext: true},
		{endpoint: "http://collector", addr: "collector:4317", plaintext: true},
		{endpoint: "https://collector:5000/ignored/path", insecure: true, addr: "collector:5000"},
		{endpoint: "127.0.0.1:4317", insecure: true, addr: "127.0.0.1:4317", plaintext: true},
		{endpoint: "[::1]:4317", addr: "[::1]:4317"},
		{endpoint: "http://[::1]", addr: "[::1]:4317", plaintext: true},
		{endpoint: "", err: true},
		{endpoint: "ftp://collector:21", err: true},
		{endpoint: "http://:4317", err: true},
	} {
		addr, plaintext, err := Config{Endpoint: c.endpoint, Insecure: c.insecure}.target()
		if c.err {
			if err == nil {
				t.Errorf("%q: no error", c.endpoint)
			}
			continue
		}
		if err != nil || addr != c.addr || plaintext != c.plaintext {
			t.Errorf("%q insecure=%v: got %q plaintext=%v err=%v, want %q plaintext=%v", c.endpoint, c.insecure, addr, plaintext, err, c.addr, c.plaintext)
		}
	}
}

func TestResourceFromEnv(t *testing.T) {
	r, err := ResourceFromEnv(env(map[string]string{
		"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-list,deployment.environment=prod%2Ceu, k8s.node.name = node%201 ,",
		"OTEL_SERVICE_NAME":        "sonde-agent",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"service.name":           "sonde-agent", // OTEL_SERVICE_NAME wins
		"deployment.environment": "prod,eu",
		"k8s.node.name":          "node 1",
	}
	if !maps.Equal(r.Attributes, want) {
		t.Errorf("attributes = %v, want %v", r.Attributes, want)
	}
	if r.HostName == "" {
		t.Errorf("no host name")
	}

	r, err = ResourceFromEnv(env(map[string]string{
		"OTEL_RESOURCE_ATTRIBUTES": "good=1,bad",
		"OTEL_SERVICE_NAME":        "svc",
	}))
	if err == nil || !strings.Contains(err.Error(), "OTEL_RESOURCE_ATTRIBUTES") {
		t.Errorf("malformed list: error = %v", err)
	}
	// The whole list is ignored, but the service name still applies.
	if !maps.Equal(r.Attributes, map[string]string{"service.name": "svc"}) {
		t.Errorf("attributes after a malformed list = %v", r.Attributes)
	}

	if _, err := ParseResourceAttributes("k=%zz"); err == nil {
		t.Errorf("bad percent-encoding accepted")
	}
	if _, err := ParseResourceAttributes("=v"); err == nil {
		t.Errorf("empty key accepted")
	}
}
