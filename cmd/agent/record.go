package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sonde-profiler/sonde/cmd/agent/pipeline"
	"github.com/sonde-profiler/sonde/reporter/files"
)

const recordAbout = `Runs PROG with its ARGs, or CMD with /bin/sh -c, and profiles it and every process it
starts, from its first instruction until it exits; sonde then exits with its status
(128+N when signal N killed it). The program runs on this terminal as it would alone.

When it exits, sonde prints the hottest functions on standard error (standard output is
the program's) and writes sonde.html, a flame graph, unless --output names other files.

SIGTERM, and SIGINT not sent by the terminal (which sends Ctrl-C to the program too), are
passed on to the program; sonde waits for it and writes what was collected.`

// shimArg is the hidden first argument that makes sonde the waiting shim of `sonde
// record`: the process that becomes the program once the kernel samples its PID.
const shimArg = "__sonde_record_shim"

// defaultRecordOutput is what a recording writes without --output: something to look at.
const defaultRecordOutput = "sonde.html"

// Exit statuses of a program that could not run, as shells and env(1) report them.
const (
	statusCannotRun = 126
	statusNotFound  = 127
)

// recordMain is `sonde record`.
func recordMain(args []string) int {
	s, err := newSubcommand("record", "sonde record [flags] [--] PROG [ARG...]\n       sonde record [flags] --command CMD", recordAbout, os.Getenv, stderr)
	if err != nil {
		return usageStatus("record", err, stderr)
	}
	command := s.fs.String("command", "", "run `CMD` with /bin/sh -c instead of PROG and its ARGs")
	s.share("frequency", "", fmt.Sprintf("samples per second per CPU (`HZ`, at most %d) (default %d)", maxFrequency, targetFrequency))
	s.share("output", "", "write the run to `FILE` when the program exits; the name picks the format: "+files.Names+"; may be given more than once (default "+defaultRecordOutput+")")
	s.share("top", "", "print the `N` hottest functions on standard error when the program exits (0: none)")
	for _, name := range []string{"kernel-stacks", "symbolize", "unwind", "memory-limit", "bpf-stats", "off-cpu", "off-cpu-min", "off-cpu-rate", "off-cpu-goroutines", "view"} {
		s.share(name, "", "")
	}
	s.share("log-level", "warn", "")
	c, err := s.parse(args)
	if err != nil {
		return usageStatus("record", err, stderr)
	}
	argv := s.fs.Args()
	switch {
	case *command != "" && len(argv) > 0:
		return usageStatus("record", errors.New("give --command or a program with its arguments, not both"), stderr)
	case *command != "":
		argv = []string{"/bin/sh", "-c", *command}
	case len(argv) == 0:
		return usageStatus("record", errors.New("no program to run: sonde record -- PROG [ARG...]"), stderr)
	}
	if !s.given("frequency") {
		c.Frequency = targetFrequency
		if err := checkFrequency(c.Frequency); err != nil {
			return usageStatus("record", err, stderr)
		}
	}
	if len(c.Outputs) == 0 {
		o, err := files.Parse(defaultRecordOutput)
		if err != nil {
			return usageStatus("record", fmt.Errorf("%w (or name a file with --output)", err), stderr)
		}
		c.Outputs = []files.Output{o}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(stderr, "sonde record: %s\n", printable(err.Error()))
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return statusNotFound
		}
		return statusCannotRun
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: c.LogLevel}))
	return record(c, path, argv, log)
}

// record runs the program under the shim, profiles it until it exits, and returns the
// status sonde exits with: the program's, or 1 when sonde failed and the program did not.
func record(c *config, path string, argv []string, log *slog.Logger) int {
	// Signals are caught from the start: until the program runs they go to the shim,
	// whose death ends the recording like the program's would.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	shim, release, err := startShim(path, argv)
	if err != nil {
		fmt.Fprintf(stderr, "sonde record: %s\n", printable(err.Error()))
		return 1
	}
	defer release(false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan struct{})
	go func() {
		shim.Wait()
		close(exited)
		cancel()
	}()
	go forwardSignals(sigs, shim.Process, exited)

	c.PIDs = []uint32{uint32(shim.Process.Pid)}
	c.FollowForks = true
	p, err := pipeline.Build(c, log)
	if err != nil {
		release(false)
		<-exited
		fmt.Fprintf(stderr, "sonde record: %s\n", printable(explain(err)))
		return 1
	}
	defer p.Close()
	p.Quiet() // the terminal is the program's
	p.EndByContext()
	ran := false
	p.OnStarted(func() { ran = release(true) })
	p.TopTo(stderr)
	runErr := p.Run(ctx)
	release(false)
	<-exited // sampling can end first: the kernel saw the exit, or failed
	status := exitStatus(shim.ProcessState)
	if runErr != nil {
		fmt.Fprintf(stderr, "sonde record: %s\n", printable(explain(runErr)))
		if status == 0 || !ran {
			status = 1
		}
		return status
	}
	if !ran {
		return 1
	}
	for _, o := range c.Outputs {
		if o.Format == files.HTML {
			fmt.Fprintf(stderr, "flame graph: %s\n", fileURL(o.Path))
		}
	}
	return status
}

// startShim starts sonde again as the shim: it waits, its PID known, until release(true)
// lets it exec the program, or release(false) (or sonde's death) makes it exit unrun.
// release reports whether the program was let run; only its first call counts.
func startShim(path string, argv []string) (*exec.Cmd, func(run bool) bool, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", path, err)
	}
	defer r.Close()
	cmd := exec.Command("/proc/self/exe", append([]string{shimArg, path}, argv...)...)
	cmd.Args[0] = argv[0] // what ps shows until the exec
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{r}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("start %s: %w", path, err)
	}
	var once sync.Once
	released := false
	release := func(run bool) bool {
		once.Do(func() {
			if run {
				_, err := w.Write([]byte{1})
				released = err == nil
			}
			w.Close()
		})
		return released
	}
	return cmd, release, nil
}

// The shim must exec from the thread group's leader: an exec from another thread kills
// the leader, and the kernel reports that as the PID's exit, ending the recording before
// it starts. Locking main's goroutine in init keeps it on the leader thread.
func init() {
	if len(os.Args) > 1 && os.Args[1] == shimArg {
		runtime.LockOSThread()
	}
}

// recordShim is the shim: it waits for sonde's word on descriptor 3, then becomes the
// program, keeping its PID, which the kernel samples already.
func recordShim(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "sonde: the record shim is started by sonde record only")
		return 2
	}
	gate := os.NewFile(3, "sonde record")
	var b [1]byte
	n, _ := gate.Read(b[:])
	gate.Close()
	if n != 1 {
		return 1 // sonde could not profile: it says why
	}
	err := syscall.Exec(args[0], args[1:], os.Environ())
	fmt.Fprintf(os.Stderr, "sonde record: %s: %s\n", printable(args[0]), err)
	if errors.Is(err, syscall.ENOENT) {
		return statusNotFound
	}
	return statusCannotRun
}

// forwardSignals passes SIGTERM and SIGINT on to the program until it exits. A SIGINT
// while sonde is in its terminal's foreground came from the terminal, which sent it to
// the program too (they share a process group): passing it on would deliver Ctrl-C twice.
func forwardSignals(sigs <-chan os.Signal, child *os.Process, exited <-chan struct{}) {
	for {
		select {
		case <-exited:
			return
		case sig := <-sigs:
			if sig == os.Interrupt && inTerminalForeground() {
				continue
			}
			child.Signal(sig)
		}
	}
}

// inTerminalForeground reports whether sonde's process group is the foreground one of
// its controlling terminal.
func inTerminalForeground() bool {
	fd, err := unix.Open("/dev/tty", unix.O_RDONLY|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false // no controlling terminal
	}
	defer unix.Close(fd)
	pgrp, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP)
	return err == nil && pgrp == unix.Getpgrp()
}

// exitStatus is a shell's view of how a process ended: its exit code, or 128 plus the
// signal that killed it.
func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return 1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// fileURL is the file:// URL of path, for a terminal to open.
func fileURL(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	return (&url.URL{Scheme: "file", Path: abs}).String()
}
