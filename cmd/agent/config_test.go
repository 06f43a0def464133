package main

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/reporter/files"
)

func errAs[T any](err error, target *T) bool { return errors.As(err, target) }

func noEnv(string) string { return "" }

func TestParseConfigOTLP(t *testing.T) {
	c, err := parseConfig(nil, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Export || c.Interval != 10*time.Second || c.Timestamps {
		t.Errorf("export must be off without an endpoint: %+v", c)
	}
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true"}
	c, err = parseConfig([]string{"--interval", "2s", "--timestamps", "--output", "run.otlp.json"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Export || c.OTLP.Endpoint != "collector:4317" || !c.OTLP.Insecure || c.Interval != 2*time.Second || !c.Timestamps {
		t.Errorf("from the environment: %+v", c)
	}
	if len(c.Outputs) != 1 || c.Outputs[0].Format != files.OTLP {
		t.Errorf("run.otlp.json: outputs %+v", c.Outputs)
	}
	c, err = parseConfig([]string{"--otlp-endpoint", "127.0.0.1:9999", "--otlp-insecure=false"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.OTLP.Endpoint != "127.0.0.1:9999" || c.OTLP.Insecure {
		t.Errorf("flags must win over the environment: %+v", c.OTLP)
	}
	bad := func(k string) string { return map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}[k] }
	if _, err := parseConfig(nil, bad, io.Discard); err == nil {
		t.Error("malformed OTEL_EXPORTER_OTLP_TIMEOUT accepted")
	}
}

func TestParseConfigDefaults(t *testing.T) {
	c, err := parseConfig(nil, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Frequency != 19 || !c.KernelStacks || c.Duration != 0 || c.Top != 15 || len(c.PIDs) != 0 {
		t.Errorf("host-wide defaults: %+v", c)
	}
	c, err = parseConfig([]string{"--pid", "1,2", "-duration", "5s"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Frequency != 199 || !slices.Equal(c.PIDs, []uint32{1, 2}) || c.Duration.Seconds() != 5 {
		t.Errorf("--pid defaults: %+v", c)
	}
	c, err = parseConfig([]string{"--pid", "1", "--frequency", "49", "--kernel-stacks=false", "--output", "x.pprof"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Frequency != 49 || c.KernelStacks {
		t.Errorf("explicit flags lost: %+v", c)
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--frequency", "0"}, {"--frequency", "100000000"}, {"--pid", "0"}, {"--pid", "1,,2"},
		{"--duration", "-1s"}, {"--log-level", "loud"}, {"--output", "p.json"}, {"--top", "-1"}, {"stray"},
		{"--interval", "1ms"}, {"--otlp-queue", "0"}, {"--symbolize", "some"}, {"--symbol-cache-files", "0"},
		{"--unwind", "guess"}, {"--unwind-rows", "-1"}, {"--frequency", "10001"}, {"--memory-limit", "1MiB"},
		{"--memory-limit", "lots"}, {"--output", "."}, {"--output", "/dev/null.pb.gz/x.pb.gz"},
	} {
		_, err := parseConfig(args, noEnv, io.Discard)
		var uerr usageError
		if !errors.As(err, &uerr) {
			t.Errorf("parseConfig(%v) = %v, want a usage error", args, err)
		}
	}
}

// One precedence everywhere: flag, then SONDE_* variable, then the --config file, then
// the default; a bad key or value fails before anything starts and names itself.
func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "sonde.yaml")
	os.WriteFile(file, []byte("frequency: 49\ninterval: 3s\ntop: 3\noutput: [a.pb.gz, b.folded]\nlog-level: warn\n"), 0o644)
	env := map[string]string{"SONDE_INTERVAL": "4s", "SONDE_TOP": "5"}
	getenv := func(k string) string { return env[k] }
	c, err := parseConfig([]string{"--config", file, "--top", "7"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Frequency != 49 || c.Interval != 4*time.Second || c.Top != 7 || c.LogLevel != slog.LevelWarn {
		t.Errorf("file 49 Hz/3s/top 3, env 4s/top 5, flag top 7: got %d Hz, %v, top %d, log %v", c.Frequency, c.Interval, c.Top, c.LogLevel)
	}
	if len(c.Outputs) != 2 || c.Outputs[1].Format != files.Folded {
		t.Errorf("outputs from the file: %+v", c.Outputs)
	}
	c, err = parseConfig([]string{"--output", "c.pb.gz"}, func(k string) string { return map[string]string{"SONDE_CONFIG": file}[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Outputs) != 1 || c.Outputs[0].Path != "c.pb.gz" || c.Frequency != 49 {
		t.Errorf("SONDE_CONFIG and --output: %+v at %d Hz; the command line's outputs replace the file's", c.Outputs, c.Frequency)
	}
	for _, tc := range []struct {
		file string
		env  map[string]string
		want string
	}{
		{"frequncy: 19\n", nil, `unknown key "frequncy"`},
		{"frequency: fast\n", nil, "config file " + file + ": frequency"},
		{"interval: {a: 1}\n", nil, `key "interval"`},
		{"frequency: 19\n", map[string]string{"SONDE_FREQUENCY": "x"}, "SONDE_FREQUENCY"},
		{"[not, a, mapping]\n", nil, "not a YAML mapping"},
	} {
		os.WriteFile(file, []byte(tc.file), 0o644)
		_, err := parseConfig([]string{"--config", file}, func(k string) string { return tc.env[k] }, io.Discard)
		var uerr usageError
		if !errors.As(err, &uerr) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %q env %v: %v, want a usage error naming %q", tc.file, tc.env, err, tc.want)
		}
	}
	if _, err := parseConfig([]string{"--config", filepath.Join(dir, "missing.yaml")}, noEnv, io.Discard); err == nil {
		t.Error("a missing config file was accepted")
	}
}

// The configuration files deploy/ ships parse, every key a flag sonde has.
func TestShippedConfigParses(t *testing.T) {
	for _, p := range []string{"../../deploy/sonde.yaml"} {
		if _, err := parseConfig([]string{"--config", p}, noEnv, io.Discard); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

func TestParseConfigDebuginfod(t *testing.T) {
	c, err := parseConfig(nil, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Debuginfod.URLs) != 0 || c.Debuginfod.CacheBytes != 2<<30 {
		t.Errorf("defaults: %+v, want no servers and a 2GiB cache", c.Debuginfod)
	}
	env := map[string]string{"DEBUGINFOD_URLS": "https://a.example/ http://b.example:8002", "DEBUGINFOD_TIMEOUT": "5", "STATE_DIRECTORY": "/var/lib/sonde"}
	getenv := func(k string) string { return env[k] }
	if c, err = parseConfig(nil, getenv, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Debuginfod.URLs, []string{"https://a.example", "http://b.example:8002"}) || c.Debuginfod.Timeout != 5*time.Second ||
		c.Debuginfod.CacheDir != "/var/lib/sonde/debuginfod" {
		t.Errorf("from DEBUGINFOD_*: %+v", c.Debuginfod)
	}
	if c, err = parseConfig([]string{"--debuginfod-urls", "", "--debuginfod-cache-size", "100MiB", "--debuginfod-cache-dir", "/c"}, getenv, io.Discard); err != nil {
		t.Fatal(err)
	}
	if len(c.Debuginfod.URLs) != 0 || c.Debuginfod.CacheBytes != 100<<20 || c.Debuginfod.CacheDir != "/c" {
		t.Errorf("an empty --debuginfod-urls must disable, the flags win: %+v", c.Debuginfod)
	}
	for _, args := range [][]string{{"--debuginfod-urls", "ftp://x"}, {"--debuginfod-cache-size", "0"}, {"--debuginfod-cache-size", "lots"}} {
		if _, err := parseConfig(args, noEnv, io.Discard); !errAs(err, new(usageError)) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	bad := func(k string) string { return map[string]string{"DEBUGINFOD_MAXSIZE": "big"}[k] }
	if _, err := parseConfig(nil, bad, io.Discard); err == nil {
		t.Error("malformed DEBUGINFOD_MAXSIZE accepted")
	}
}
