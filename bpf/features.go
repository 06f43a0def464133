package bpf

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
)

// feature is something the programs need from the kernel, and the release that added it.
type feature struct {
	name, since string
	probe       func() error
}

// required lists what the programs use, oldest first, so that on an old kernel the first
// missing feature named is the one that dates it.
var required = []feature{
	{"perf_event programs", "4.9", func() error { return features.HaveProgramType(ebpf.PerfEvent) }},
	{"BPF ring buffers", "5.8", func() error { return features.HaveMapType(ebpf.RingBuf) }},
	{"inner maps of varying size (BPF_F_INNER_MAP)", "5.10", func() error { return features.HaveMapFlag(features.BPF_F_INNER_MAP) }},
	{"bpf_get_current_task_btf", "5.11", helper(ebpf.PerfEvent, asm.FnGetCurrentTaskBtf)},
	{"bpf_task_pt_regs", "5.15", helper(ebpf.PerfEvent, asm.FnTaskPtRegs)},
	{"bpf_loop", "5.17", helper(ebpf.PerfEvent, asm.FnLoop)},
	{"bpf_find_vma", "5.17", helper(ebpf.PerfEvent, asm.FnFindVma)},
}

func helper(pt ebpf.ProgramType, fn asm.BuiltinFunc) func() error {
	return func() error { return features.HaveProgramHelper(pt, fn) }
}

// CheckFeatures probes the kernel for everything the programs use and names the first
// feature missing, wrapping ErrNoBPF. A probe that fails for lack of privileges reports
// ErrPermission.
func CheckFeatures() error { return checkFeatures(required) }

func checkFeatures(list []feature) error {
	if err := checkBTF(); err != nil {
		return err
	}
	for _, f := range list {
		if err := f.check(); err != nil {
			return err
		}
	}
	return nil
}

func checkBTF() error {
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return fmt.Errorf("kernel BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF, Linux 5.4 or later): %w: %w", ErrNoBPF, err)
	}
	return nil
}

func (f feature) check() error {
	err := f.probe()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ebpf.ErrNotSupported):
		return fmt.Errorf("%s (Linux %s or later): %w: %w", f.name, f.since, ErrNoBPF, err)
	default:
		return classify("probe for "+f.name, err)
	}
}

// FeatureStatus is one thing sonde needs from the kernel and whether this kernel has it.
type FeatureStatus struct {
	Name string
	// Since is the Linux release that added it.
	Since string
	// Err is nil when the kernel has the feature. It wraps ErrNoBPF when the kernel lacks
	// it, ErrPermission when the probe was refused (probes load small programs and maps,
	// which needs the privileges sonde runs with), and is some other error when the
	// probe itself failed.
	Err error
}

// Available reports whether the kernel has the feature.
func (f FeatureStatus) Available() bool { return f.Err == nil }

// Features reports every feature CheckFeatures probes, kernel BTF first, each with its
// own status: a bug report then says all that this kernel lacks, not only the first.
func Features() []FeatureStatus {
	return featureStatuses(append(required[:len(required):len(required)], optional...))
}

// optional lists what only some settings use; their absence turns those off with a
// message, not sonde.
var optional = []feature{
	{"sched_switch BTF tracepoint (--off-cpu)", "5.5", ProbeOffCPU},
	{"uprobe PMU (--off-cpu-goroutines, with CAP_SYS_ADMIN)", "4.17", ProbeUprobes},
}

func featureStatuses(list []feature) []FeatureStatus {
	out := []FeatureStatus{{Name: "kernel BTF (/sys/kernel/btf/vmlinux)", Since: "5.4", Err: checkBTF()}}
	for _, f := range list {
		out = append(out, FeatureStatus{Name: f.name, Since: f.since, Err: f.check()})
	}
	return out
}
