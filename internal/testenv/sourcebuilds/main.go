// Command sourcebuilds builds, one after the other, the runtimes no distribution package
// has and the tests build from source (testenv.YJITRuby, testenv.FreeThreadedPython),
// where no complete build is cached, and prints their paths. CI runs it in the background
// while the steps before the tests run.
package main

import (
	"fmt"
	"log"
	"os"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

func main() {
	failed := false
	for _, b := range []struct {
		name  string
		build func(logf func(string, ...any)) (string, error)
	}{
		{"ruby with yjit", testenv.BuildYJITRuby},
		{"free-threaded python", testenv.BuildFreeThreadedPython},
	} {
		path, err := b.build(log.Printf)
		if err != nil {
			fmt.Fprintf(os.Stderr, "sourcebuilds: %s: %v\n", b.name, err)
			failed = true
			continue
		}
		fmt.Println(path)
	}
	if failed {
		os.Exit(1)
	}
}
