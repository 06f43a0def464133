// Command debroot builds the Debian root the tests run containers' runtimes in (see
// testenv.DebianRoot), if no complete one is cached, and prints its path. CI runs it in the
// background while the steps before the tests run, so that the tests find the root built.
package main

import (
	"fmt"
	"log"
	"os"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

func main() {
	root, err := testenv.BuildDebianRoot(log.Printf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "debroot:", err)
		os.Exit(1)
	}
	fmt.Println(root)
}
