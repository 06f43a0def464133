package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/cmd/agent/pipeline"
)

// versionMain is `sonde version`.
func versionMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sonde version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sonde version\n\nPrints sonde's version, the Go release it was built with, this kernel's release, the\nprivileges sonde has, and which of the kernel features sonde needs this kernel has:\nwhat a bug report needs. The same as sonde --version.\n")
	}
	if err := fs.Parse(args); err != nil {
		return usageStatus("version", usageError{err}, stderr)
	}
	if fs.NArg() > 0 {
		return usageStatus("version", usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}, stderr)
	}
	if err := writeVersion(stdout); err != nil {
		fmt.Fprintf(stderr, "sonde version: %v\n", err)
		return 1
	}
	return 0
}

// writeVersion reports what a bug report needs: versions, kernel, privileges, and every
// feature sonde probes for. Without privileges the probes cannot load their programs,
// and the report says so rather than calling the features missing.
func writeVersion(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "sonde %s\n", buildVersion())
	fmt.Fprintf(&b, "go: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		fmt.Fprintf(&b, "kernel: %s %s %s %s\n", unix.ByteSliceToString(u.Sysname[:]), unix.ByteSliceToString(u.Release[:]),
			unix.ByteSliceToString(u.Version[:]), unix.ByteSliceToString(u.Machine[:]))
	}
	caps, capsErr := pipeline.EffectiveCaps()
	privileged := os.Geteuid() == 0 || caps&(1<<unix.CAP_BPF) != 0 && caps&(1<<unix.CAP_PERFMON) != 0 || caps&(1<<unix.CAP_SYS_ADMIN) != 0
	fmt.Fprintf(&b, "privileges: uid %d, %s\n", os.Geteuid(), capNames(caps, capsErr))
	if rate, err := os.ReadFile("/proc/sys/kernel/perf_event_max_sample_rate"); err == nil {
		fmt.Fprintf(&b, "kernel.perf_event_max_sample_rate: %s\n", strings.TrimSpace(string(rate)))
	}
	b.WriteString("features:\n")
	refused := false
	for _, f := range bpf.Features() {
		status := "yes"
		switch {
		case f.Available():
		case errors.Is(f.Err, bpf.ErrPermission):
			status, refused = "?  ", true
		default:
			status = "no "
		}
		fmt.Fprintf(&b, "  %s  %s (Linux %s)", status, f.Name, f.Since)
		if !f.Available() && !errors.Is(f.Err, bpf.ErrPermission) {
			fmt.Fprintf(&b, ": %v", f.Err)
		}
		b.WriteByte('\n')
	}
	if refused || !privileged {
		b.WriteString("The feature probes load BPF programs and maps: without root (or CAP_BPF and CAP_PERFMON)\nthe kernel refuses them ('?'); run sudo sonde version for a full report.\n")
	}
	_, err := io.WriteString(w, printable(b.String()))
	return err
}

// buildVersion is the Makefile's version, or for a plain go build the commit Go stamped.
func buildVersion() string {
	if version != "dev" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return version
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "-dirty"
			}
		}
	}
	if rev == "" {
		return version
	}
	return fmt.Sprintf("%s (%.12s%s)", version, rev, modified)
}

// capNames lists the capabilities sonde uses that the process has.
func capNames(caps uint64, err error) string {
	if err != nil {
		return "capabilities unknown: " + err.Error()
	}
	missing := map[string]bool{}
	for _, name := range pipeline.MissingCapabilities(caps) {
		missing[name] = true
	}
	var have, lack []string
	for _, name := range pipeline.CapabilityNames() {
		if missing[name] {
			lack = append(lack, name)
		} else {
			have = append(have, name)
		}
	}
	s := "with " + strings.Join(have, " ")
	if len(have) == 0 {
		s = "with none of " + strings.Join(lack, " ")
	} else if len(lack) > 0 {
		s += ", without " + strings.Join(lack, " ")
	}
	return s
}
