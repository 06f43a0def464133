package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"

	"github.com/google/pprof/profile"
)

// readSonde reads sonde's pprof profile into stats.
func readSonde(path string, ids *identities) (*profileStats, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	st := newStats()
	for _, s := range p.Sample {
		frames := make([]frame, 0, len(s.Location))
		for _, l := range s.Location {
			fr := frame{addr: l.Address}
			if l.Mapping != nil {
				fr.dso = l.Mapping.File
				if fr.dso != kernelDSO {
					if v, ok := ids.vaddr(fr.dso, l.Address-l.Mapping.Start+l.Mapping.Offset); ok {
						fr.addr = v
					}
				}
			}
			if n := len(l.Line); n > 0 && l.Line[n-1].Function != nil {
				// The physical function, as perf names a frame without its inlined calls.
				fr.name = l.Line[n-1].Function.Name
			}
			frames = append(frames, fr)
		}
		st.add(ids, frames, s.Value[0])
	}
	return st, nil
}

// summaryCounters reads the kernel's counters from sonde's summary line.
func summaryCounters(log string) map[string]uint64 {
	out := map[string]uint64{}
	for _, m := range regexp.MustCompile(`kernel\.([a-z_]+)=(\d+)`).FindAllStringSubmatch(log, -1) {
		v, _ := strconv.ParseUint(m[2], 10, 64)
		out[m[1]] = v
	}
	return out
}

// perfFrame is a callchain line of perf script: address, symbol, (dso).
var perfFrame = regexp.MustCompile(`^\s+([0-9a-f]+) (.*) \((.*)\)$`)

// readPerf reads a perf.data file through perf script, one sample per block.
func readPerf(path string, ids *identities) (*profileStats, error) {
	cmd := exec.Command("perf", "script", "-i", path, "-F", "comm,tid,ip,sym,dso", "--no-inline")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("perf script: %v\n%s", err, stderr.Bytes())
	}
	st := newStats()
	var frames []frame
	flush := func() {
		if frames != nil {
			st.add(ids, frames, 1)
		}
		frames = nil
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		m := perfFrame.FindStringSubmatch(line)
		if m == nil {
			// A sample's header: comm and tid.
			flush()
			frames = []frame{}
			continue
		}
		addr, _ := strconv.ParseUint(m[1], 16, 64)
		fr := frame{addr: addr, dso: m[3], name: m[2]}
		// perf prints a user frame's address as an offset in its file.
		if fr.dso != kernelDSO {
			if v, ok := ids.vaddr(fr.dso, addr); ok {
				fr.addr = v
			}
		}
		if fr.name == "[unknown]" {
			fr.name = ""
		}
		if i := strings.LastIndex(fr.name, "+0x"); i > 0 {
			fr.name = fr.name[:i]
		}
		frames = append(frames, fr)
	}
	flush()
	return st, nil
}
