package flame

import (
	"embed"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/sonde-profiler/sonde/reporter/internal/frames"
	"github.com/sonde-profiler/sonde/trace"
)

//go:embed assets/page.html assets/flame.css assets/flame.js assets/svg.css assets/svg.js
var assets embed.FS

func asset(name string) string {
	b, err := assets.ReadFile("assets/" + name)
	if err != nil {
		panic(err) // embedded at build time: cannot be missing
	}
	return string(b)
}

// Bounds on what the page lists; the flame graph itself always holds every node.
// The process list is folded and filtered on the page, so it can hold a whole busy
// host: each process has a node in the graph's data anyway, which costs more than its
// entry in the list.
const (
	maxTopRows   = 1000
	maxProcesses = 10000
)

// WriteHTML writes p as one self-contained HTML page: the flame graph (hover for
// details, click to zoom, search), the top table beside it and the facts above, the
// processes folded into one line that opens into a list with a filter. The graph opens
// in the icicle layout, roots on top, so that they are on the first screen however deep
// the stacks are; a toggle turns it into a flame graph, roots at the bottom. The page
// loads nothing: its script, style and data are inline, and its content security
// policy forbids any request.
//
// The profile reaches the page only as JSON inside a script element of type
// application/json, with <, > and & escaped, and the page's script puts it into the
// document as text, never as markup: no function, file or process name can inject
// anything.
func WriteHTML(w io.Writer, p *trace.Profile, facts Facts) error {
	data, err := json.Marshal(newPageData(NewTree(p), facts))
	if err != nil {
		return fmt.Errorf("write flame graph page: %w", err)
	}
	title := "sonde flame graph"
	if facts.Host != "" {
		title += ": " + frames.Clean(facts.Host)
	}
	r := strings.NewReplacer(
		"@@TITLE@@", html.EscapeString(title),
		"@@CSS@@", asset("flame.css"),
		"@@JS@@", asset("flame.js"),
		"@@DATA@@", string(data),
	)
	if _, err := r.WriteString(w, asset("page.html")); err != nil {
		return fmt.Errorf("write flame graph page: %w", err)
	}
	return nil
}

// pageData is what the page's script reads. Nodes are flat, in preorder, nodeFields
// numbers each: name and file (indices into Strings), line, kind (index into Kinds),
// self, total, depth. Flat numbers parse several times faster than objects, which
// counts at a hundred thousand nodes.
type pageData struct {
	Facts   factsJSON  `json:"facts"`
	Strings []string   `json:"strings"`
	Kinds   []string   `json:"kinds"`
	Nodes   []int64    `json:"nodes"`
	Top     [][3]int64 `json:"top"` // name (index into Strings), self, cum
	TopMore int        `json:"topMore"`
}

const nodeFields = 7

type factsJSON struct {
	Host          string        `json:"host,omitempty"`
	Processes     []processJSON `json:"processes,omitempty"`
	ProcessesMore int           `json:"processesMore,omitempty"`
	Start         string        `json:"start,omitempty"`
	End           string        `json:"end,omitempty"`
	Duration      float64       `json:"durationSeconds,omitempty"`
	Frequency     float64       `json:"frequencyHz,omitempty"`
	Samples       int64         `json:"samples"`
	Lost          *int64        `json:"lostSamples,omitempty"`
	Version       string        `json:"version,omitempty"`
	Command       string        `json:"command,omitempty"`
	Note          string        `json:"note,omitempty"`
}

type processJSON struct {
	PID     uint32 `json:"pid"`
	Name    string `json:"name"`
	Samples int64  `json:"samples"`
}

// kinds are the frame kinds every page knows; a language runtime's frames add their own.
var kinds = []string{"", "native", "kernel", "go", "process"}

func newPageData(t *Tree, f Facts) *pageData {
	d := &pageData{Kinds: slices.Clone(kinds), Facts: newFactsJSON(f)}
	strs := map[string]int64{}
	str := func(s string) int64 {
		i, ok := strs[s]
		if !ok {
			i = int64(len(d.Strings))
			d.Strings = append(d.Strings, s)
			strs[s] = i
		}
		return i
	}
	str("")
	kindIndex := map[string]int64{}
	for i, k := range kinds {
		kindIndex[k] = int64(i)
	}
	walk(t.Root, func(n *Node, depth int) {
		k, ok := kindIndex[n.Kind]
		if !ok {
			k = int64(len(d.Kinds))
			kindIndex[n.Kind] = k
			d.Kinds = append(d.Kinds, frames.Clean(n.Kind))
		}
		d.Nodes = append(d.Nodes, str(n.Name), str(n.File), n.Line, k, n.Self, n.Total, int64(depth))
	})
	top := t.Top()
	if len(top) > maxTopRows {
		d.TopMore = len(top) - maxTopRows
		top = top[:maxTopRows]
	}
	d.Top = make([][3]int64, len(top))
	for i, r := range top {
		d.Top[i] = [3]int64{str(r.Name), r.Self, r.Cum}
	}
	return d
}

func newFactsJSON(f Facts) factsJSON {
	j := factsJSON{
		Host:      frames.Clean(f.Host),
		Frequency: f.Frequency,
		Samples:   f.Samples,
		Version:   frames.Clean(f.Version),
		Command:   frames.Clean(shellQuote(f.CommandLine)),
		Note:      frames.Clean(f.Note),
	}
	if !f.Start.IsZero() {
		j.Start = f.Start.Format(time.RFC3339)
	}
	if !f.End.IsZero() {
		j.End = f.End.Format(time.RFC3339)
	}
	if !f.Start.IsZero() && f.End.After(f.Start) {
		j.Duration = f.End.Sub(f.Start).Seconds()
	}
	if f.LostSamples >= 0 {
		lost := f.LostSamples
		j.Lost = &lost
	}
	procs := f.Processes
	if len(procs) > maxProcesses {
		j.ProcessesMore = len(procs) - maxProcesses
		procs = procs[:maxProcesses]
	}
	for _, p := range procs {
		j.Processes = append(j.Processes, processJSON{PID: p.PID, Name: frames.Clean(p.Name), Samples: p.Samples})
	}
	return j
}
