package testprog

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// goLabels burns CPU for os.Args[1] inside pprof.Do with the labels trace_id and span_id
// (hex of the iteration) and route, 50 ms per iteration, on two goroutines; with a second
// argument "none" it burns without labels.
const goLabels = `package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"time"
)

var sink uint64

//go:noinline
func burn(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		for i := 0; i < 10000; i++ {
			sink = sink*31 + uint64(i)
		}
	}
}

func main() {
	run, _ := time.ParseDuration(os.Args[1])
	labels := len(os.Args) < 3 || os.Args[2] != "none"
	fmt.Println("ready")
	var wg sync.WaitGroup
	for w := 1; w <= 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for n, end := 1, time.Now().Add(run); time.Now().Before(end); n++ {
				if !labels {
					burn(50 * time.Millisecond)
					continue
				}
				l := pprof.Labels("trace_id", fmt.Sprintf("%030x%02x", n, w), "span_id", fmt.Sprintf("%014x%02x", n, w), "route", "/work")
				pprof.Do(context.Background(), l, func(context.Context) { burn(50 * time.Millisecond) })
			}
		}(w)
	}
	wg.Wait()
}
`

// BuildGoLabels builds the labelled Go program with the Go toolchain GOTOOLCHAIN names
// ("local": the one running the tests) and returns its path. It runs as PROG DURATION
// [none], printing "ready" first.
func BuildGoLabels(t testing.TB, toolchain string, flags ...string) string {
	t.Helper()
	goBin := testenv.RequireTool(t, "go")
	dir := t.TempDir()
	for name, src := range map[string]string{"main.go": goLabels, "go.mod": "module golabels\n\ngo 1.21\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "golabels")
	cmd := exec.Command(goBin, append(append([]string{"build", "-o", bin}, flags...), ".")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN="+toolchain, "GOWORK=off", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		testenv.Unavailable(t, "build the Go labels program with %s: %v\n%s", toolchain, err, out)
	}
	return bin
}
