package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// install runs `make install` with everything under one temporary prefix, so the
// unit's ExecStart names a binary that exists.
func install(t *testing.T, args ...string) string {
	t.Helper()
	requireBinary(t)
	prefix := t.TempDir()
	cmd := exec.Command("make", append([]string{"-C", root, "install", "PREFIX=" + prefix, "SYSCONFDIR=" + prefix + "/etc"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	return prefix
}

func TestSystemdUnitVerifies(t *testing.T) {
	analyze := testenv.RequireTool(t, "systemd-analyze")
	prefix := install(t)
	unit := filepath.Join(prefix, "lib/systemd/system/sonde.service")
	text := string(readFile(t, unit))
	for _, want := range []string{
		"ExecStart=" + prefix + "/bin/sonde --config " + prefix + "/etc/sonde/sonde.yaml",
		"EnvironmentFile=-" + prefix + "/etc/sonde/sonde.env",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("installed unit lacks %q", want)
		}
	}
	if out, err := exec.Command(analyze, "verify", unit).CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// The offline security audit scores the unit's sandboxing from 0 (best) to 10.
	out, err := exec.Command(analyze, "security", "--offline=yes", "--no-pager", unit).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for sonde\.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	if level, _ := strconv.ParseFloat(string(m[1]), 64); level > 3.5 {
		t.Errorf("exposure level %s, want at most 3.5 (3.0 when written)", m[1])
	}
}

// TestSystemdUnitCapabilities keeps the unit's capabilities those of the DaemonSet.
func TestSystemdUnitCapabilities(t *testing.T) {
	text := string(readFile(t, filepath.Join(root, "deploy/systemd/sonde.service")))
	for _, key := range []string{"CapabilityBoundingSet", "AmbientCapabilities"} {
		m := regexp.MustCompile(`(?m)^` + key + `=(.*)$`).FindStringSubmatch(text)
		if m == nil {
			t.Errorf("no %s", key)
			continue
		}
		var got []string
		for _, c := range strings.Fields(m[1]) {
			got = append(got, strings.TrimPrefix(c, "CAP_"))
		}
		if strings.Join(got, " ") != strings.Join(wantCaps, " ") {
			t.Errorf("%s = %v, want %v", key, got, wantCaps)
		}
	}
	for _, want := range []string{"NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
		"EnvironmentFile=", "Restart=on-failure", "MemoryMax=", "StateDirectory=sonde"} {
		if !strings.Contains(text, "\n"+want) {
			t.Errorf("unit lacks %s", want)
		}
	}
	// These would cost sonde kernel symbols or other processes (deploy/README.md).
	for _, bad := range []string{"ProtectKernelTunables=yes", "ProtectKernelLogs=yes", "ProtectProc=invisible", "ProcSubset=pid"} {
		if strings.Contains(text, "\n"+bad) {
			t.Errorf("unit sets %s", bad)
		}
	}
}

// TestInstallKeepsConfiguration: reinstalling must not overwrite an edited sonde.yaml.
func TestInstallKeepsConfiguration(t *testing.T) {
	requireBinary(t)
	dest := t.TempDir()
	run := func() {
		cmd := exec.Command("make", "-C", root, "install", "DESTDIR="+dest, "PREFIX=/usr")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make install: %v\n%s", err, out)
		}
	}
	run()
	conf := filepath.Join(dest, "etc/sonde/sonde.yaml")
	for _, f := range []string{"usr/bin/sonde", "usr/lib/systemd/system/sonde.service", "etc/sonde/sonde.yaml", "etc/sonde/sonde.env"} {
		if _, err := os.Stat(filepath.Join(dest, f)); err != nil {
			t.Errorf("DESTDIR install: %v", err)
		}
	}
	if err := os.WriteFile(conf, []byte("frequency: 7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run()
	if got := string(readFile(t, conf)); got != "frequency: 7\n" {
		t.Errorf("reinstall replaced the configuration with:\n%s", got)
	}
}

// requireBinary: the tests use the binary `make build` made (make test-deploy builds it).
func requireBinary(t *testing.T) string {
	t.Helper()
	p := filepath.Join(root, "bin/sonde")
	if _, err := os.Stat(p); err != nil {
		testenv.Unavailable(t, "no %s: run make build (make test-deploy does)", p)
	}
	return p
}
