//go:build amd64

package unwind

import (
	"debug/elf"
	"errors"
	"io"
	"sync"
	"testing"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testprog"
	"github.com/sonde-profiler/sonde/trace"
)

// fakeProbes stands in for the sampler's goroutine probes.
type fakeProbes struct {
	mu       sync.Mutex
	attached map[string]GoProbes // by path, while attached
	attaches int
	fail     map[string]bool
}

type probesCloser struct {
	p    *fakeProbes
	path string
}

func (c probesCloser) Close() error {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	delete(c.p.attached, c.path)
	return nil
}

func (p *fakeProbes) AttachGoroutines(f *objfile.File, at GoProbes) (io.Closer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail[f.Path] {
		return nil, errors.New("no uprobes here")
	}
	p.attaches++
	p.attached[f.Path] = at
	return probesCloser{p, f.Path}, nil
}

func (p *fakeProbes) state() (map[string]GoProbes, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]GoProbes{}
	for k, v := range p.attached {
		out[k] = v
	}
	return out, p.attaches
}

// goTextMapping maps a Go binary's executable segment at its link address.
func goTextMapping(t *testing.T, f *objfile.File) *trace.Mapping {
	t.Helper()
	ef, err := elf.Open(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			start, off := p.Vaddr&^0xfff, p.Off&^0xfff
			return &trace.Mapping{Start: start, End: p.Vaddr + p.Memsz, Offset: off, Path: f.Path, File: f}
		}
	}
	t.Fatal("no executable segment")
	return nil
}

// A Go binary's goroutines are followed once its table is in the kernel, once however
// many processes run it, until the table is evicted; a binary the probes fail on is
// counted, and keeps its table.
func TestMaintainerGoroutineProbes(t *testing.T) {
	goBin := testprog.BuildGo(t, testprog.GoInlining)
	k := newFakeKernel(2)
	probes := &fakeProbes{attached: map[string]GoProbes{}, fail: map[string]bool{}}
	var reported []string
	m, settle := runMaintainer(t, MaintainerConfig{Kernel: k, MaxMappings: 4, Goroutines: probes,
		OnError: func(what string, err error) { reported = append(reported, what) }})
	goFile := objfile.HostFile(objfile.Key{Dev: 1, Inode: 10}, goBin)
	goFile.IsGo = true
	m.ProcessMappings(1, 0, []*trace.Mapping{goTextMapping(t, goFile)})
	m.ProcessMappings(2, 0, []*trace.Mapping{goTextMapping(t, goFile)})
	settle()
	attached, n := probes.state()
	if at := attached[goBin]; n != 1 || at.Park == 0 || at.Execute == 0 {
		t.Fatalf("attached %v in %d attaches; want the binary's probes, once", attached, n)
	}
	if st := m.Stats(); st.GoProbes != 1 {
		t.Errorf("stats %+v", st)
	}

	// Idle, the table and its probes stay; evicted for another file, the probes go too.
	m.ProcessGone(1)
	m.ProcessGone(2)
	settle()
	if attached, _ := probes.state(); len(attached) != 1 {
		t.Fatalf("an idle table's probes detached: %v", attached)
	}
	failing := objfile.HostFile(objfile.Key{Dev: 1, Inode: 11}, copyFile(t, goBin))
	failing.IsGo = true
	probes.fail[failing.Path] = true
	pie := objfile.HostFile(objfile.Key{Dev: 1, Inode: 12}, buildPIE(t))
	m.ProcessMappings(3, 0, []*trace.Mapping{goTextMapping(t, failing)})
	m.ProcessMappings(4, 0, []*trace.Mapping{textMapping(pie, 0x1000)})
	settle()
	attached, n = probes.state()
	st := m.Stats()
	if len(attached) != 0 || n != 1 || st.GoProbes != 0 || st.GoProbeErrors != 1 || st.TablesEvicted != 1 {
		t.Errorf("after the eviction: attached %v (%d attaches), stats %+v", attached, n, st)
	}
	if len(reported) != 0 {
		t.Errorf("OnError, which says a file has no table, heard %q", reported)
	}
	if pm, _ := k.process(3); len(pm) != 1 || pm[0].RowsCount == 0 {
		t.Errorf("a binary whose probes failed lost its table: %+v", pm)
	}
}
