// Command yjitruby builds the Ruby with YJIT the tests run (see testenv.YJITRuby), if no
// complete one is cached, and prints its path. CI runs it in the background while the
// steps before the tests run.
package main

import (
	"fmt"
	"log"
	"os"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

func main() {
	path, err := testenv.BuildYJITRuby(log.Printf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "yjitruby:", err)
		os.Exit(1)
	}
	fmt.Println(path)
}
