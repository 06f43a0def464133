package php

import (
	"debug/elf"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/interp/interptest"
	"github.com/sonde-profiler/sonde/trace"
)

// TestTracker: the engine among a process's mappings is placed at its load bias with its
// JIT buffer where opcache made one; a process without the engine costs nothing more, and
// one gone is deleted from the kernel.
func TestTracker(t *testing.T) {
	path := testenv.HostPHP(t).File()
	php := interptest.HostFile(t, path)
	other := interptest.HostFile(t, "/bin/sh")
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	e, err := Inspect(f)
	if err != nil {
		t.Fatal(err)
	}
	var text elf.ProgHeader
	for _, p := range e.loads {
		if p.Flags&elf.PF_X != 0 {
			text = p
		}
	}
	const base = 0x5600_0000_0000
	start := base + text.Vaddr&^0xfff
	maps := []*trace.Mapping{
		{Start: 0x400000, End: 0x500000, File: other},
		{Start: start, End: start + text.Filesz, Offset: text.Off &^ 0xfff, File: php},
	}
	jit := &trace.Mapping{Start: 0x4852_6000, End: 0x4a52_6000, Offset: 0x800_0000, Path: "/dev/zero (deleted)"}
	k := interptest.NewKernel[KernelState]()
	tr := NewTracker(TrackerConfig{Kernel: k})
	tr.ProcessMappings(10, 5, maps)
	tr.ProcessMappings(11, 6, append(maps, jit))
	tr.ProcessMappings(12, 7, maps[:1])
	if st := tr.Stats(); st.FilesInspected != 2 || st.Engines != 1 || st.Processes != 2 {
		t.Errorf("stats %+v: want 2 files inspected once each, 1 engine, 2 PHP processes", st)
	}
	s, withJIT := k.States[10], k.States[11]
	if s == nil || withJIT == nil || k.States[12] != nil {
		t.Fatalf("kernel state %+v", k.States)
	}
	if s.ExecID != 5 || s.ExecStart != base+e.Exec[0] || s.Current != base+e.Globals+uint64(e.Layout.CurrentExecuteData) ||
		s.ColdStart != base+e.ExecCold[0] || s.JitCFA == 0 || s.JitStart != 0 {
		t.Errorf("state %+v for an engine at %#x", s, uint64(base))
	}
	if withJIT.JitStart != jit.Start || withJIT.JitEnd != jit.End {
		t.Errorf("JIT buffer %#x-%#x, want %#x-%#x", withJIT.JitStart, withJIT.JitEnd, jit.Start, jit.End)
	}
	// The JIT buffer made later: the kernel is told again.
	tr.ProcessMappings(10, 5, append(maps, jit))
	if k.States[10].JitStart != jit.Start {
		t.Errorf("JIT buffer mapped later: state %+v", k.States[10])
	}
	tr.ProcessGone(10)
	tr.ProcessGone(12)
	if len(k.Deleted) != 1 || k.Deleted[0] != 10 || tr.Image(10) != nil {
		t.Errorf("deleted %v: want only the PHP process", k.Deleted)
	}
}
