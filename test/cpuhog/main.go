// Command cpuhog keeps one core busy, at the priority it was started with, until it is
// killed, its -for runs out, or the process that started it exits. CI runs the BPF end-to-end
// tests a second time beside it (make test-busy): a test that needs an idle machine, a fast
// CPU or a fixed share of a core fails there instead of on somebody's busy host.
package main

import (
	"flag"
	"os"
	"runtime"
	"time"
)

func main() {
	limit := flag.Duration("for", time.Hour, "stop after this long")
	flag.Parse()
	runtime.GOMAXPROCS(1)
	parent := os.Getppid()
	end := time.Now().Add(*limit)
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
