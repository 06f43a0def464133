package flame

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/sonde-profiler/sonde/trace"
)

// Facts describe the run a flame graph shows; the page prints them above the graph.
// Zero fields are left out.
type Facts struct {
	Host      string
	Processes []Process
	// Start and End bound the profile; the page shows the duration between them.
	Start, End time.Time
	// Frequency is the sampling rate per CPU in Hz.
	Frequency float64
	Samples   int64
	// LostSamples are the samples the kernel dropped; negative when unknown, as for a
	// profile read back from a file.
	LostSamples int64
	Version     string
	// CommandLine is sonde's argv.
	CommandLine []string
	// Note is a sentence about the run for the reader, shown above the graph (an idle
	// host's profile says so, and how to profile a program instead).
	Note string
}

// Process is one profiled process and its share of the samples.
type Process struct {
	PID     uint32
	Name    string
	Samples int64
}

// FactsFrom fills in what the profile itself tells: its processes, busiest first,
// time span, frequency and samples. Lost samples are unknown. The caller adds the host,
// version, command line and lost samples it knows.
func FactsFrom(p *trace.Profile) Facts {
	f := Facts{Start: p.Start, End: p.End, Samples: p.TotalCount(), LostSamples: -1}
	if p.Period > 0 {
		f.Frequency = float64(time.Second) / float64(p.Period)
	}
	type pidName struct {
		pid  uint32
		name string
	}
	byPID := make(map[pidName]*Process)
	for _, s := range p.Samples {
		if s.Process == nil {
			continue
		}
		k := pidName{s.Process.PID, s.Process.Name}
		pr := byPID[k]
		if pr == nil {
			pr = &Process{PID: k.pid, Name: k.name}
			byPID[k] = pr
		}
		pr.Samples += s.Count
	}
	for _, pr := range byPID {
		f.Processes = append(f.Processes, *pr)
	}
	slices.SortFunc(f.Processes, func(a, b Process) int {
		return cmp.Or(cmp.Compare(b.Samples, a.Samples), cmp.Compare(a.PID, b.PID), strings.Compare(a.Name, b.Name))
	})
	return f
}

// shellQuote joins argv so that it reads, and pastes, as a shell command.
func shellQuote(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=+/.,:@%") == "" {
			quoted[i] = a
			continue
		}
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(quoted, " ")
}
