// Command sonde is a continuous CPU profiler: it samples stacks with eBPF and writes
// profiles for one process or the whole host.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/cmd/agent/pipeline"
)

// version is set at build time by the Makefile.
var version = "dev"

func main() {
	os.Exit(runMain(os.Args[1:]))
}

func runMain(args []string) int {
	if status, ok := dispatch(args); ok {
		return status
	}
	cfg, err := parseConfig(args, os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if errors.Is(err, errShowVersion) {
		return versionMain(nil, os.Stdout, os.Stderr)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sonde: %v\nRun 'sonde --help' for usage.\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := pipeline.Run(ctx, cfg, log); err != nil {
		fmt.Fprintf(os.Stderr, "sonde: %s\n", explain(err))
		if isUsage(err) {
			return 2
		}
		return 1
	}
	return 0
}

// stderr is where sonde logs, through the pipeline's writer, which clears a progress line
// before a log line.
var stderr = pipeline.Stderr

// isUsage tells an error in how sonde was invoked, which exits with status 2.
func isUsage(err error) bool {
	var uerr usageError
	var perr pipeline.UsageError
	return errors.As(err, &uerr) || errors.As(err, &perr)
}

// explain turns missing kernel features and privileges into one sentence saying how to fix them.
func explain(err error) string {
	switch {
	case errors.Is(err, bpf.ErrPermission):
		return "sonde needs root, or at least the capabilities CAP_BPF and CAP_PERFMON (see deploy/README.md for the full set), to load its BPF programs: run it with sudo (" + err.Error() + ")"
	case errors.Is(err, bpf.ErrNoOffCPU):
		return "--off-cpu needs the kernel's sched_switch BTF tracepoint (Linux 5.5 or later with CONFIG_DEBUG_INFO_BTF), which this kernel lacks; run without --off-cpu (" + err.Error() + ")"
	case errors.Is(err, bpf.ErrNoBPF):
		return "this kernel lacks what sonde's BPF programs need (Linux 5.17 or later, built with CONFIG_BPF_SYSCALL, CONFIG_BPF_EVENTS and CONFIG_DEBUG_INFO_BTF); missing: " + err.Error()
	default:
		return err.Error()
	}
}
