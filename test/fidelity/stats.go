package main

import (
	"cmp"
	"debug/elf"
	"debug/gosym"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sonde-profiler/sonde/unwind"
)

// frame is a frame as either tool recorded it: the file and the ELF virtual address in it
// (an absolute address for the kernel), and the tool's name for it, "" for none.
type frame struct {
	dso  string
	addr uint64
	name string
}

const kernelDSO = "[kernel.kallsyms]"

// profileStats is what one tool recorded of one program.
type profileStats struct {
	samples     int64
	complete    int64
	self        map[string]int64  // leaf function identity → samples
	names       map[string]string // identity → the tool's name for it
	unnamedLeaf int64
	// ends counts the outermost frames of incomplete stacks, by name, to say where
	// walks stop.
	ends     map[string]int64
	counters map[string]uint64 // sonde's kernel counters
}

func newStats() *profileStats {
	return &profileStats{self: map[string]int64{}, names: map[string]string{}, ends: map[string]int64{}}
}

// add counts one stack, leaf first.
func (p *profileStats) add(ids *identities, frames []frame, n int64) {
	p.samples += n
	if len(frames) == 0 {
		return
	}
	leaf := frames[0]
	id := ids.identity(leaf, true)
	p.self[id] += n
	if leaf.name != "" && p.names[id] == "" {
		p.names[id] = leaf.name
	}
	if leaf.name == "" {
		p.unnamedLeaf += n
	}
	// The outermost user frame says whether the walk reached a thread's start.
	for i := len(frames) - 1; i >= 0; i-- {
		f := frames[i]
		if f.dso == kernelDSO {
			continue
		}
		if ids.isRoot(f, i == 0) {
			p.complete += n
		} else {
			name := f.name
			if name == "" {
				name = ids.identity(f, i == 0)
			}
			p.ends[name] += n
		}
		return
	}
}

// rootNames are the functions a complete stack ends in, as symbol tables name them: a
// thread's start in glibc, and the Go runtime's roots. The main thread's _start is found
// by address too (the ELF entry point), for stripped executables.
var rootNames = map[string]bool{
	"_start": true, "clone": true, "clone3": true, "__clone": true, "__clone3": true,
	"runtime.goexit": true, "runtime.mstart": true, "runtime.rt0_go": true, "runtime.mcall": true, "runtime.morestack": true,
}

var nameSuffix = regexp.MustCompile(`(\.abi0|\+0x[0-9a-f]+|@@?[A-Z_0-9.]+)$`)

func baseName(s string) string { return nameSuffix.ReplaceAllString(s, "") }

// identities names functions by where they are, not by what a tool calls them: the file
// and the start of the FDE (or, in Go code, of the pclntab function) covering an address.
// Both tools' frames are counted by the same identities, so their shares compare even
// where one names what the other cannot.
type identities struct {
	mu    sync.Mutex
	files map[string]*dsoInfo
}

type dsoInfo struct {
	ranges []unwind.CodeRange
	gofn   *gosym.Table
	entry  unwind.CodeRange // the function holding the ELF entry point, for executables
	loads  []elf.ProgHeader
}

func newIdentities() *identities { return &identities{files: map[string]*dsoInfo{}} }

func (ids *identities) info(dso string) *dsoInfo {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	if d, ok := ids.files[dso]; ok {
		return d
	}
	d := &dsoInfo{}
	ids.files[dso] = d
	f, err := elf.Open(dso)
	if err != nil {
		return d
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			d.loads = append(d.loads, p.ProgHeader)
		}
	}
	d.ranges, _ = unwind.FunctionRanges(f)
	if s, t := f.Section(".gopclntab"), f.Section(".text"); s != nil && t != nil {
		if data, err := s.Data(); err == nil {
			start := t.Addr
			if syms, err := f.Symbols(); err == nil {
				for _, sym := range syms {
					if sym.Name == "runtime.text" {
						start = sym.Value
					}
				}
			}
			d.gofn, _ = gosym.NewTable(nil, gosym.NewLineTable(data, start))
		}
	}
	if f.Type == elf.ET_EXEC || (f.Type == elf.ET_DYN && f.Section(".interp") != nil) {
		d.entry = d.rangeAt(f.Entry)
	}
	return d
}

func (d *dsoInfo) rangeAt(vaddr uint64) unwind.CodeRange {
	i := sort.Search(len(d.ranges), func(i int) bool { return d.ranges[i].End > vaddr })
	if i < len(d.ranges) && d.ranges[i].Start <= vaddr {
		return d.ranges[i]
	}
	return unwind.CodeRange{}
}

// vaddr turns an offset in a file into its ELF virtual address.
func (ids *identities) vaddr(dso string, off uint64) (uint64, bool) {
	for _, p := range ids.info(dso).loads {
		if off >= p.Off && off < p.Off+p.Filesz {
			return off - p.Off + p.Vaddr, true
		}
	}
	return 0, false
}

// identity names a frame's function by place; leaf frames are exact, callers return
// addresses, looked up one byte back.
func (ids *identities) identity(f frame, leaf bool) string {
	if f.dso == kernelDSO || f.dso == "" {
		if f.name != "" {
			return "[k] " + baseName(f.name)
		}
		return fmt.Sprintf("%s+%#x", f.dso, f.addr)
	}
	at := f.addr
	if !leaf && at > 0 {
		at--
	}
	d := ids.info(f.dso)
	if d.gofn != nil {
		if fn := d.gofn.PCToFunc(at); fn != nil {
			return fn.Name
		}
	}
	if r := d.rangeAt(at); r.End > 0 {
		return fmt.Sprintf("%s+%#x", filepath.Base(f.dso), r.Start)
	}
	if f.name != "" {
		return filepath.Base(f.dso) + " " + baseName(f.name)
	}
	return fmt.Sprintf("%s+%#x", filepath.Base(f.dso), f.addr)
}

// isRoot says whether a frame is where a thread's stack begins.
func (ids *identities) isRoot(f frame, leaf bool) bool {
	if rootNames[baseName(f.name)] {
		return true
	}
	d := ids.info(f.dso)
	if d.gofn != nil {
		at := f.addr
		if !leaf {
			at--
		}
		if fn := d.gofn.PCToFunc(at); fn != nil && rootNames[baseName(fn.Name)] {
			return true
		}
	}
	at := f.addr
	if !leaf && at > 0 {
		at--
	}
	return d.entry.End > 0 && at >= d.entry.Start && at < d.entry.End
}

// result is the comparison of one program.
type result struct {
	workload    workload
	sonde, perf *profileStats
}

type share struct {
	id    string
	sonde float64
	perf  float64
}

// top returns a profile's n hottest leaf functions.
func top(p *profileStats, n int) []string {
	ids := make([]string, 0, len(p.self))
	for id := range p.self {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int { return cmp.Or(cmp.Compare(p.self[b], p.self[a]), strings.Compare(a, b)) })
	return ids[:min(n, len(ids))]
}

func frac(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// compare returns the overlap of the two top-10s and the function whose share differs
// most among them.
func (r *result) compare() (overlap int, worst share) {
	ts, tp := top(r.sonde, 10), top(r.perf, 10)
	for _, id := range ts {
		if slices.Contains(tp, id) {
			overlap++
		}
	}
	for _, id := range append(slices.Clone(ts), tp...) {
		s := share{id: id, sonde: frac(r.sonde.self[id], r.sonde.samples), perf: frac(r.perf.self[id], r.perf.samples)}
		if d, w := abs(s.sonde-s.perf), abs(worst.sonde-worst.perf); d > w {
			worst = s
		}
	}
	return overlap, worst
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// displayName is how a function identity reads in the tables: the names the tools gave
// it, or the identity.
func (r *result) displayName(id string) string {
	s, p := r.sonde.names[id], r.perf.names[id]
	switch {
	case s != "" && baseName(s) != baseName(p) && p != "":
		return fmt.Sprintf("%s (perf: %s)", short(s), short(p))
	case s != "":
		return short(s)
	case p != "":
		return short(p)
	}
	return id
}

func short(s string) string {
	if len(s) > 60 {
		return s[:57] + "..."
	}
	return s
}

// outcomes is sonde's own account of its walks.
func (r *result) outcomes() string {
	c := r.sonde.counters
	total := c["unwind_complete"] + c["unwind_complete_fp"] + c["unwind_truncated"] + c["unwind_failed"]
	if total == 0 {
		return "n/a"
	}
	out := fmt.Sprintf("complete %.1f %% (tables %.1f, fp %.1f), truncated %.1f %%", pct(c["unwind_complete"]+c["unwind_complete_fp"], total),
		pct(c["unwind_complete"], total), pct(c["unwind_complete_fp"], total), pct(c["unwind_truncated"], total))
	var kinds []string
	for k, v := range c {
		if v > 0 && strings.HasPrefix(k, "unwind_") && !slices.Contains([]string{"unwind_complete", "unwind_complete_fp", "unwind_truncated", "unwind_failed", "unwind_no_user_stack"}, k) {
			kinds = append(kinds, fmt.Sprintf("%s %d", strings.TrimPrefix(k, "unwind_"), v))
		}
	}
	slices.Sort(kinds)
	if len(kinds) > 0 {
		out += ", failed: " + strings.Join(kinds, ", ")
	}
	return out
}

func pct(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

func (r *result) details() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n== %s: %s\n", r.workload.name, r.workload.about)
	fmt.Fprintf(&b, "samples: sonde %d, perf %d; complete stacks: sonde %.2f %%, perf %.2f %%\n", r.sonde.samples, r.perf.samples,
		100*frac(r.sonde.complete, r.sonde.samples), 100*frac(r.perf.complete, r.perf.samples))
	fmt.Fprintf(&b, "sonde's outcomes: %s\n", r.outcomes())
	for _, t := range []struct {
		name string
		p    *profileStats
	}{{"sonde", r.sonde}, {"perf", r.perf}} {
		fmt.Fprintf(&b, "top 10 self, %s:\n", t.name)
		for _, id := range top(t.p, 10) {
			fmt.Fprintf(&b, "  %6.2f %%  %s\n", 100*frac(t.p.self[id], t.p.samples), r.displayName(id))
		}
		ends := top(&profileStats{self: t.p.ends}, 5)
		if len(ends) > 0 {
			fmt.Fprintf(&b, "incomplete stacks of %s end at:", t.name)
			for _, e := range ends {
				fmt.Fprintf(&b, " %s (%.2f %%)", short(e), 100*frac(t.p.ends[e], t.p.samples))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

func markdownTable(rs []*result) string {
	var b strings.Builder
	b.WriteString("| program | samples sonde / perf | complete stacks sonde | complete stacks perf | top-10 self overlap | largest share difference | unnamed leaves sonde / perf | sonde's outcome counters |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		overlap, worst := r.compare()
		fmt.Fprintf(&b, "| %s | %d / %d | %.2f %% | %.2f %% | %d / 10 | %s: %.1f %% vs %.1f %% | %.2f %% / %.2f %% | %s |\n",
			r.workload.name, r.sonde.samples, r.perf.samples, 100*frac(r.sonde.complete, r.sonde.samples), 100*frac(r.perf.complete, r.perf.samples),
			overlap, strings.ReplaceAll(r.displayName(worst.id), "|", "\\|"), 100*worst.sonde, 100*worst.perf,
			100*frac(r.sonde.unnamedLeaf, r.sonde.samples), 100*frac(r.perf.unnamedLeaf, r.perf.samples), r.outcomes())
	}
	return b.String()
}

// The table of docs/fidelity.md lies between these markers; the rest of the document is
// written by hand.
const (
	tableBegin = "<!-- fidelity table: begin -->"
	tableEnd   = "<!-- fidelity table: end -->"
)

func rewriteDoc(path, table string, rs []*result, d time.Duration) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(doc)
	i, j := strings.Index(s, tableBegin), strings.Index(s, tableEnd)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %q ... %q markers", path, tableBegin, tableEnd)
	}
	host, _ := os.Hostname()
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	var details strings.Builder
	for _, r := range rs {
		details.WriteString(r.details())
	}
	block := fmt.Sprintf("%s\n\nMeasured %s on %s (Linux %s), %v per program.\n\n%s\n<details><summary>Per program: the hottest functions of each tool, and where incomplete stacks end</summary>\n\n```%s```\n</details>\n\n",
		tableBegin, time.Now().UTC().Format("2006-01-02"), host, strings.TrimSpace(string(kernel)), d, table, details.String())
	s = s[:i] + block + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}
