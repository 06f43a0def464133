package main

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/bpf"
)

// A bug report's facts: versions, kernel, privileges, and a line for every probed feature.
func TestVersionReport(t *testing.T) {
	var out, errs bytes.Buffer
	if status := versionMain(nil, &out, &errs); status != 0 {
		t.Fatalf("status %d: %s", status, errs.String())
	}
	text := out.String()
	for _, want := range []string{"sonde " + version, runtime.Version(), "kernel: Linux ", "privileges: uid ", "features:\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in:\n%s", want, text)
		}
	}
	for _, f := range bpf.Features() {
		if !strings.Contains(text, f.Name+" (Linux "+f.Since+")") {
			t.Errorf("feature %s not reported:\n%s", f.Name, text)
		}
	}
	if status := versionMain([]string{"extra"}, io.Discard, &errs); status != 2 {
		t.Errorf("sonde version extra: status %d, want 2", status)
	}
	if _, err := parseConfig([]string{"--version"}, noEnv, io.Discard); !errors.Is(err, errShowVersion) {
		t.Errorf("sonde --version parsed to %v", err)
	}
}
