//go:build amd64

package bpf

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/internal/testprog"
	"github.com/sonde-profiler/sonde/trace"
	"github.com/sonde-profiler/sonde/unwind"
	"github.com/sonde-profiler/sonde/unwind/walkmodel"
)

// TestWalkersAgreeRecorded stops real programs with ptrace at random points, and walks
// each stopped thread with both walkers: the registers ptrace reports, the memory
// /proc/PID/mem holds, and the tables and mappings that sonde's own process tracker and
// table maintainer make of the running process, as they would for the kernel.
func TestWalkersAgreeRecorded(t *testing.T) {
	testenv.RequireTool(t, "gcc")
	var progs []recordedProgram
	for _, flags := range [][]string{{"-O2", "-fomit-frame-pointer", "-no-pie"}, {"-O2", "-fomit-frame-pointer", "-fPIE", "-pie"}} {
		bin := testprog.BuildStacks(t, flags...)
		for _, mode := range []string{"sort", "deep", "signal", "drap", "deref", "index"} {
			progs = append(progs, recordedProgram{fmt.Sprintf("%s %s %v", filepath.Base(bin), mode, flags), []string{bin, "20", mode}})
		}
	}
	cases := recordAll(t, progs, 6)
	complete := 0
	for i, r := range compareWalkers(t, cases) {
		if UnwindEnd(r.end) == UnwindComplete && len(r.frames) >= 3 {
			complete++
		} else {
			t.Logf("%s: %s", cases[i].name, r)
		}
	}
	// The programs are built so that a walk of their stacks reaches main: most walks must
	// be complete, or the agreement was on broken walks.
	if complete < len(cases)*9/10 {
		t.Errorf("%d of %d recorded walks complete, want nine in ten", complete, len(cases))
	}
	t.Logf("%d recorded walks, %d complete", len(cases), complete)
}

// recordedKernel stands in for the kernel's maps, as the Maintainer writes them.
type recordedKernel struct {
	mu     sync.Mutex
	next   uint32
	tables map[uint32][]unwind.KernelRow
	goRT   map[uint32]*unwind.KernelGoRuntime
	procs  map[uint32][]unwind.KernelMapping
}

func (k *recordedKernel) AddTable(t unwind.KernelTable, g *unwind.KernelGoRuntime) (uint32, error) {
	var rows []unwind.KernelRow
	if err := t.Each(func(part []unwind.KernelRow) error {
		rows = append(rows, part...)
		return nil
	}); err != nil {
		return 0, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	id := k.next
	k.next++
	k.tables[id] = rows
	if g != nil {
		c := *g
		k.goRT[id] = &c
	}
	return id, nil
}

func (k *recordedKernel) RemoveTable(id uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.tables, id)
	delete(k.goRT, id)
	return nil
}

func (k *recordedKernel) SetProcess(pid uint32, execID uint64, m []unwind.KernelMapping) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.procs[pid] = slices.Clone(m)
	return nil
}

func (k *recordedKernel) DeleteProcess(pid uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.procs, pid)
	return nil
}

// kernelView reads a process's state from the tables the Maintainer wrote.
func (k *recordedKernel) view(pid uint32) (maps []unwind.KernelMapping, tables map[uint32][]unwind.KernelRow, goRT map[uint32]*unwind.KernelGoRuntime) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.procs[pid]), k.tables, k.goRT
}

// recordedProgram is a program to record walks of: a name and its command line.
type recordedProgram struct {
	name string
	argv []string
}

// recordAll records n walk cases of each program, a few programs at a time.
func recordAll(t *testing.T, progs []recordedProgram, n int) []*walkCase {
	t.Helper()
	var (
		mu    sync.Mutex
		cases []*walkCase
		wg    sync.WaitGroup
		slots = make(chan struct{}, 3)
	)
	for _, prog := range progs {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			cs, err := recordProgram(t, prog.name, n, prog.argv...)
			if err != nil {
				t.Errorf("%s: %v", prog.name, err)
			}
			mu.Lock()
			cases = append(cases, cs...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortStableFunc(cases, func(a, b *walkCase) int { return strings.Compare(a.name, b.name) })
	return cases
}

// recordProgram runs a program and returns n walk cases, each taken by stopping one of
// its threads at a random moment.
func recordProgram(t *testing.T, name string, n int, argv ...string) ([]*walkCase, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := cmd.Process.Pid
	testenv.WaitCPU(t, pid, 100*time.Millisecond) // past start-up: the program's own work

	k := &recordedKernel{tables: map[uint32][]unwind.KernelRow{}, goRT: map[uint32]*unwind.KernelGoRuntime{}, procs: map[uint32][]unwind.KernelMapping{}}
	maint := unwind.NewMaintainer(unwind.MaintainerConfig{Kernel: k, MaxMappings: MaxProcessMappings,
		OnError: func(what string, err error) { t.Logf("%s: no table for %s: %v", name, what, err) }})
	procs := trace.NewProcesses(trace.ProcessConfig{Observer: maint, Pinned: []uint32{uint32(pid)}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { procs.Run(ctx) })
	wg.Go(func() { maint.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	settle, stop := context.WithTimeout(ctx, 20*time.Second)
	defer stop()
	procs.Prime(uint32(pid))
	procs.Settle(settle)
	maint.Settle(settle)

	maps, tables, goRT := k.view(uint32(pid))
	if len(maps) == 0 {
		return nil, fmt.Errorf("the maintainer wrote no mappings for pid %d", pid)
	}
	var cases []*walkCase
	for i := range n {
		time.Sleep(time.Duration(5+rand.IntN(40)) * time.Millisecond)
		tid, err := pickThread(pid)
		if err != nil {
			return cases, err
		}
		c := &walkCase{name: fmt.Sprintf("%s: snapshot %d of thread %d", name, i, tid), maps: maps, tables: tables, goRT: goRT}
		if err := stopAndCopy(pid, tid, c); err != nil {
			return cases, err
		}
		cases = append(cases, c)
	}
	return cases, nil
}

// pickThread picks one of the process's threads at random.
func pickThread(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(ents) == 0 {
		return 0, fmt.Errorf("threads of %d: %v", pid, err)
	}
	return strconv.Atoi(ents[rand.IntN(len(ents))].Name())
}

// stopAndCopy stops a thread with ptrace, takes its registers, and copies the memory a
// walk of its stack reads: the pages the Go model touches while the thread stands still,
// so that the native walker, reading anything else, would fail and disagree.
func stopAndCopy(pid, tid int, c *walkCase) error {
	return testenv.StopThread(tid, func(regs *unix.PtraceRegs) error { return copyStack(pid, regs, c) })
}

// copyStack takes a stopped thread's registers and the memory a walk of its stack reads.
func copyStack(pid int, regs *unix.PtraceRegs, c *walkCase) error {
	c.thread = walkmodel.Thread{PC: regs.Rip, TLS: regs.Fs_base, GPR: [16]uint64{
		regs.Rax, regs.Rdx, regs.Rcx, regs.Rbx, regs.Rsi, regs.Rdi, regs.Rbp, regs.Rsp,
		regs.R8, regs.R9, regs.R10, regs.R11, regs.R12, regs.R13, regs.R14, regs.R15}}

	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return err
	}
	defer mem.Close()
	pages := map[uint64][]byte{} // nil: unreadable
	page := func(base uint64) []byte {
		if b, ok := pages[base]; ok {
			return b
		}
		b := make([]byte, 4096)
		if n, err := mem.ReadAt(b, int64(base)); err != nil || n != len(b) {
			b = nil
		}
		pages[base] = b
		return b
	}
	read := func(addr uint64) (uint64, bool) {
		var w [8]byte
		for i := range w {
			b := page((addr + uint64(i)) &^ 4095)
			if b == nil {
				return 0, false
			}
			w[i] = b[(addr+uint64(i))&4095]
		}
		return uint64(w[0]) | uint64(w[1])<<8 | uint64(w[2])<<16 | uint64(w[3])<<24 |
			uint64(w[4])<<32 | uint64(w[5])<<40 | uint64(w[6])<<48 | uint64(w[7])<<56, true
	}
	k := walkmodel.KernelView{Mappings: c.maps, Table: c.table, GoRuntime: func(id uint32) *unwind.KernelGoRuntime { return c.goRT[id] }}
	walkmodel.Walk(c.thread, k, read)
	// Also the pages around the stack pointer, which a walker that read more than the
	// model would reach first.
	for d := uint64(0); d < 4; d++ {
		page((c.thread.GPR[7] &^ 4095) + d*4096)
	}
	bases := make([]uint64, 0, len(pages))
	for base, b := range pages {
		if b != nil {
			bases = append(bases, base)
		}
	}
	slices.Sort(bases)
	for _, base := range bases {
		if n := len(c.mem); n > 0 && c.mem[n-1].addr+uint64(len(c.mem[n-1].b)) == base {
			c.mem[n-1].b = append(c.mem[n-1].b, pages[base]...)
			continue
		}
		c.mem = append(c.mem, memRegion{addr: base, b: slices.Clone(pages[base])})
	}
	return nil
}

// TestWalkersAgreeRecordedGo records Go programs, built with today's Go and with an
// older release: one whose garbage collector keeps its threads on g0 stacks, and one
// whose C code calls back into Go. Threads are picked at random, idle ones included.
func TestWalkersAgreeRecordedGo(t *testing.T) {
	testenv.RequireTool(t, "gcc")
	var progs []recordedProgram
	for _, toolchain := range []string{"", "go1.23.4"} {
		gc := testprog.BuildGoWith(t, testprog.GoGC, toolchain, "CGO_ENABLED=0")
		cgo := testprog.BuildGoWith(t, testprog.GoCgo, toolchain, "CGO_ENABLED=1")
		progs = append(progs, recordedProgram{"gc " + toolchain, []string{gc, "20"}}, recordedProgram{"cgo " + toolchain, []string{cgo, "20"}})
	}
	cases := recordAll(t, progs, 20)
	complete := 0
	for i, r := range compareWalkers(t, cases) {
		if e := UnwindEnd(r.end); (e == UnwindComplete || e == UnwindCompleteFP) && len(r.frames) >= 2 {
			complete++
		} else {
			t.Logf("%s: %s", cases[i].name, r)
		}
	}
	if complete < len(cases)*9/10 {
		t.Errorf("%d of %d recorded walks complete, want nine in ten", complete, len(cases))
	}
	t.Logf("%d recorded walks, %d complete", len(cases), complete)
}
