// Command cpuhog keeps one core busy, at the priority it was started with, until it is
// killed, its -for runs out, or the process that started it exits. CI runs the tests that
// sample with BPF beside it (make test BUSY=1): a test that needs an idle machine, a fast
// CPU or a fixed share of a core fails there instead of on somebody's busy host.
//
// With -beside, cpuhog runs the command its arguments name while a hog of its own (a child
// process, scheduled as any other) keeps a core busy, and exits as the command did. As go
// test's -exec, it makes each test binary run beside the hog while the compiler, which runs
// before, has the machine to itself.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"time"
)

func main() {
	limit := flag.Duration("for", time.Hour, "stop after this long")
	beside := flag.Bool("beside", false, "run the command the arguments name beside a hog, and exit as it does")
	flag.Parse()
	if *beside {
		os.Exit(runBeside(flag.Args()))
	}
	hog(*limit)
}

// runBeside runs argv while a hog child runs, and returns argv's exit status.
func runBeside(argv []string) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "cpuhog -beside: no command")
		return 2
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cpuhog:", err)
		return 2
	}
	h := exec.Command(self, "-for", "6h")
	if err := h.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "cpuhog: start the hog:", err)
		return 2
	}
	defer func() { h.Process.Kill(); h.Wait() }()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		return exit.ExitCode()
	default:
		fmt.Fprintln(os.Stderr, "cpuhog:", err)
		return 2
	}
}

// hog spins one thread until limit passes or its parent exits.
func hog(limit time.Duration) {
	runtime.GOMAXPROCS(1)
	parent := os.Getppid()
	end := time.Now().Add(limit)
	var acc uint64
	for time.Now().Before(end) {
		for i := range uint64(1 << 22) {
			acc = acc*6364136223846793005 + i
		}
		// Orphaned (the make that started it died): re-parented, and nobody is left to stop it.
		if os.Getppid() != parent {
			break
		}
	}
	if acc == 42 {
		println(acc) // keeps the loop from being optimised away
	}
}
