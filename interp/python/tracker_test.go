package python

import (
	"debug/elf"
	"os"
	"path/filepath"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/interp/interptest"
	"github.com/sonde-profiler/sonde/trace"
)

// TestTracker: the interpreter among a process's mappings is found and placed at its load
// bias; a file is inspected once whatever maps it; a process without one costs nothing
// more; a process gone is deleted from the kernel.
func TestTracker(t *testing.T) {
	py := testenv.Pythons(t)[0]
	lib := interptest.HostFile(t, py.Lib)
	sh, _ := filepath.EvalSymlinks("/bin/sh")
	other := interptest.HostFile(t, sh)
	self, _ := os.Executable()
	goFile := interptest.HostFile(t, self) // Go programs embed no CPython: not even inspected
	e, err := elf.Open(py.Lib)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	in, err := Inspect(e)
	if err != nil {
		t.Fatal(err)
	}
	var text elf.ProgHeader
	for _, p := range in.loads {
		if p.Flags&elf.PF_X != 0 {
			text = p
		}
	}
	const base = 0x7f00_0000_0000
	start := base + text.Vaddr&^0xfff
	maps := []*trace.Mapping{
		{Start: 0x400000, End: 0x500000, File: other},
		{Start: 0x600000, End: 0x700000, File: goFile},
		{Start: start, End: start + text.Filesz, Offset: text.Off &^ 0xfff, File: lib},
	}
	k := interptest.NewKernel[KernelState]()
	tr := NewTracker(TrackerConfig{Kernel: k})
	tr.ProcessMappings(10, 5, maps)
	tr.ProcessMappings(11, 6, maps)
	tr.ProcessMappings(12, 7, maps[:1])
	st := tr.Stats()
	if st.FilesInspected != 2 || st.Interpreters != 1 || st.Processes != 2 {
		t.Errorf("stats %+v: want 2 files inspected once each, 1 interpreter, 2 Python processes", st)
	}
	s := k.States[10]
	if s == nil || k.States[12] != nil {
		t.Fatalf("kernel state %+v", k.States)
	}
	if s.ExecID != 5 || s.EvalStart != base+in.Eval[0] || s.Runtime != base+in.Runtime || s.Model == 0 || s.FrameSize == 0 || s.FrameSize > maxFrameRead {
		t.Errorf("state %+v for an interpreter at %#x (eval %#x)", s, uint64(base), in.Eval[0])
	}
	if img := tr.Image(10); img == nil || img.codeType != base+in.CodeType {
		t.Errorf("image %+v", img)
	}
	tr.ProcessGone(10)
	tr.ProcessGone(12)
	if len(k.Deleted) != 1 || k.Deleted[0] != 10 || tr.Image(10) != nil {
		t.Errorf("deleted %v: want only the Python process", k.Deleted)
	}
}
