//go:build amd64

package unwind

import (
	"debug/elf"
	"fmt"
	"testing"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testprog"
	"github.com/sonde-profiler/sonde/trace"
)

// A Go binary gets a small table of its own (the runtime's switches; Go code by frame
// pointer) and its runtime's layout, stored with it.
func TestMaintainerGoBinary(t *testing.T) {
	bin := testprog.BuildGoWith(t, testprog.GoGC, "", "CGO_ENABLED=0")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	var text elf.ProgHeader
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			text = p.ProgHeader
		}
	}
	f.Close()
	k := newFakeKernel(10)
	var errs []string
	m, settle := runMaintainer(t, MaintainerConfig{Kernel: k, MaxMappings: 8, OnError: func(what string, err error) { errs = append(errs, fmt.Sprint(what, err)) }})
	file := objfile.HostFile(objfile.Key{Dev: 1, Inode: 3}, bin)
	file.IsGo = true
	m.ProcessMappings(20, 1, []*trace.Mapping{{Start: text.Vaddr, End: text.Vaddr + text.Memsz, Offset: text.Off, Path: bin, File: file}})
	settle()
	if len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	pm, _ := k.process(20)
	if len(pm) != 1 || pm[0].RowsCount == 0 || pm[0].Bias != 0 {
		t.Fatalf("mappings %+v: want the binary's table, no bias", pm)
	}
	rows := k.tables[pm[0].TableId]
	gos, fps := 0, 0
	for _, r := range rows {
		switch CFARule(r.CfaRule) {
		case CFAGo:
			gos++
		case CFAFramePointer:
			fps++
		}
	}
	if gos < 6 || fps < 6 || len(rows) > 200 {
		t.Errorf("%d rows, %d of Go functions, %d of frame pointers: want a small table of both", len(rows), gos, fps)
	}
	if g, ok := k.goRT[pm[0].TableId]; !ok || g.G_sched != 56 || g.TlsG != -8 {
		t.Errorf("go runtime layout %+v (stored: %v)", g, ok)
	}
}
