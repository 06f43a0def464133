package pipeline

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/sonde-profiler/sonde/bpf"
)

// capability is one the deployments grant sonde, and what it buys.
type capability struct {
	name      string
	bit       uint
	for_      string // what sonde uses it for
	without   string // what degrades without it; empty for those sonde cannot run without
	impliedBy uint   // a broader capability that grants the same, or 0
}

const capSysAdmin = 21

// capabilities are those deploy/ grants (see deploy/README.md for how they were measured).
var capabilities = []capability{
	{name: "CAP_BPF", bit: 39, for_: "load its BPF programs", impliedBy: capSysAdmin},
	{name: "CAP_PERFMON", bit: 38, for_: "open the sampling perf events", impliedBy: capSysAdmin},
	{name: "CAP_SYS_PTRACE", bit: 19, for_: "read other processes' mappings and files through /proc/PID/root",
		without: "frames of other users' and containers' processes keep addresses only and are walked by frame pointer"},
	{name: "CAP_DAC_READ_SEARCH", bit: 2, for_: "read files their owners did not open to others",
		without: "frames in such files keep addresses only"},
	{name: "CAP_SYSLOG", bit: 34, for_: "read kernel symbol addresses in /proc/kallsyms",
		without: "kernel frames keep addresses only where kernel.kptr_restrict hides them"},
	{name: "CAP_CHECKPOINT_RESTORE", bit: 40, for_: "open /proc/PID/map_files, which reaches deleted and in-memory code",
		without: "frames in deleted files and memfd code keep addresses only", impliedBy: capSysAdmin},
}

// effectiveCaps reads the process's effective capability set.
func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no CapEff in /proc/self/status")
}

// missingCaps returns the capabilities of the set missing from eff.
func missingCaps(eff uint64) []capability {
	var out []capability
	for _, c := range capabilities {
		has := eff&(1<<c.bit) != 0 || (c.impliedBy != 0 && eff&(1<<c.impliedBy) != 0)
		if !has {
			out = append(out, c)
		}
	}
	return out
}

// checkCapabilities fails, naming them, when capabilities sonde cannot run without are
// missing, and says once for each other missing one what degrades.
func checkCapabilities(log *slog.Logger) error {
	eff, err := effectiveCaps()
	if err != nil {
		return nil // the kernel will say what it refuses
	}
	missing := missingCaps(eff)
	var fatal []string
	for _, c := range missing {
		if c.without == "" {
			fatal = append(fatal, c.name+" (to "+c.for_+")")
		}
	}
	if len(fatal) > 0 {
		return fmt.Errorf("missing %s: %w", strings.Join(fatal, " and "), bpf.ErrPermission)
	}
	for _, c := range missing {
		// deploy/ leaves CAP_CHECKPOINT_RESTORE out on purpose: that is news, not a warning.
		level := slog.LevelWarn
		if c.impliedBy != 0 {
			level = slog.LevelInfo
		}
		log.Log(context.Background(), level, "missing "+c.name+": "+c.without, "needed_to", c.for_)
	}
	return nil
}

// EffectiveCaps returns sonde's effective capabilities, a bit per capability number.
func EffectiveCaps() (uint64, error) { return effectiveCaps() }

// CapabilityNames lists the capabilities sonde uses.
func CapabilityNames() []string {
	out := make([]string, len(capabilities))
	for i, c := range capabilities {
		out[i] = c.name
	}
	return out
}

// MissingCapabilities lists the capabilities sonde uses that eff lacks.
func MissingCapabilities(eff uint64) []string {
	var out []string
	for _, c := range missingCaps(eff) {
		out = append(out, c.name)
	}
	return out
}
