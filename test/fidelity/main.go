package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	sonde := flag.String("sonde", "../../bin/sonde", "the sonde binary")
	duration := flag.Duration("duration", 15*time.Second, "how long each program is profiled")
	only := flag.String("programs", "", "comma-separated programs to run (default all)")
	out := flag.String("out", "", "markdown file whose table to rewrite")
	keep := flag.String("keep", "", "directory to keep the profiles in")
	flag.Parse()
	if os.Geteuid() != 0 {
		log.Fatal("fidelity: needs root, for sonde's BPF programs and perf on another process")
	}
	var results []*result
	for _, w := range workloads {
		if *only != "" && !strings.Contains(","+*only+",", ","+w.name+",") {
			continue
		}
		r, err := run(w, *sonde, *duration, *keep)
		if err != nil {
			log.Printf("%s: %v", w.name, err)
			continue
		}
		results = append(results, r)
		fmt.Print(r.details())
	}
	table := markdownTable(results)
	fmt.Println()
	fmt.Print(table)
	if *out != "" {
		if err := rewriteDoc(*out, table, results, *duration); err != nil {
			log.Fatal(err)
		}
	}
}

// run profiles one workload with both tools at once.
func run(w workload, sonde string, d time.Duration, keep string) (*result, error) {
	dir, err := os.MkdirTemp("", "fidelity-"+w.name)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	argv, err := w.prepare(dir)
	if err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	time.Sleep(time.Second) // past start-up, and past the shell's exec
	pid := strconv.Itoa(cmd.Process.Pid)
	log.Printf("%s: pid %s: %s", w.name, pid, strings.Join(argv, " "))

	sondeOut := filepath.Join(dir, "sonde.pb.gz")
	perfData := filepath.Join(dir, "perf.data")
	var wg sync.WaitGroup
	var sondeErr, perfErr error
	var sondeLog, perfLog bytes.Buffer
	wg.Go(func() {
		c := exec.Command(sonde, "--pid", pid, "--duration", d.String(), "--output", sondeOut, "--top", "0")
		c.Stderr = &sondeLog
		sondeErr = c.Run()
	})
	wg.Go(func() {
		c := exec.Command("perf", "record", "-q", "-e", "cpu-clock", "-F", "199", "--call-graph", "dwarf,16384",
			"-p", pid, "-o", perfData, "--", "sleep", strconv.FormatFloat(d.Seconds(), 'f', -1, 64))
		c.Stderr = &perfLog
		perfErr = c.Run()
	})
	wg.Wait()
	if cmd.ProcessState != nil {
		return nil, fmt.Errorf("the program exited before the profiles were taken")
	}
	cmd.Process.Kill()
	cmd.Wait()
	if sondeErr != nil {
		return nil, fmt.Errorf("sonde: %v\n%s", sondeErr, sondeLog.Bytes())
	}
	if perfErr != nil {
		return nil, fmt.Errorf("perf record: %v\n%s", perfErr, perfLog.Bytes())
	}
	if keep != "" {
		os.MkdirAll(keep, 0o755)
		for _, f := range []string{sondeOut, perfData} {
			if b, err := os.ReadFile(f); err == nil {
				os.WriteFile(filepath.Join(keep, w.name+"-"+filepath.Base(f)), b, 0o644)
			}
		}
	}
	log.Printf("%s: reading the profiles", w.name)
	ids := newIdentities()
	s, err := readSonde(sondeOut, ids)
	if err != nil {
		return nil, err
	}
	s.counters = summaryCounters(sondeLog.String())
	p, err := readPerf(perfData, ids)
	if err != nil {
		return nil, err
	}
	return &result{workload: w, sonde: s, perf: p}, nil
}
