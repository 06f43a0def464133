package bpf

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
)

// ErrNoOffCPU: the kernel offers no sched_switch BTF tracepoint, which off-CPU profiles
// attach to.
var ErrNoOffCPU = errors.New("kernel lacks the sched_switch BTF tracepoint (tp_btf, 5.5, with BTF) that off-CPU profiles need")

// Off-CPU defaults.
const (
	// DefaultOffCPUMin is the shortest wait recorded.
	DefaultOffCPUMin = time.Millisecond
	// DefaultOffCPUWalks is how many switch-outs per second each CPU walks before it
	// samples them.
	DefaultOffCPUWalks = 1000
	// DefaultOffCPUThreads is how many waiting threads the kernel follows at once.
	DefaultOffCPUThreads = 16384
	// maxOffCPUPending bounds the walked switch-outs user space keeps until they end.
	maxOffCPUPending = 65536
	// maxGoPending bounds the parked goroutines' walks user space keeps until they run.
	maxGoPending = 16384
)

// ProbeOffCPU tells whether this kernel lets off-CPU profiles attach: it has BTF and a
// sched_switch BTF tracepoint.
func ProbeOffCPU() error {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("%w: %w: %w", ErrNoOffCPU, ebpf.ErrNotSupported, err)
	}
	var fn *btf.Typedef
	if err := spec.TypeByName("btf_trace_sched_switch", &fn); err != nil {
		return fmt.Errorf("%w: %w: %w", ErrNoOffCPU, ebpf.ErrNotSupported, err)
	}
	return nil
}

// setOffCPU writes the off-CPU settings into the spec before it is loaded.
func setOffCPU(spec *ebpf.CollectionSpec, cfg Config, self uint32) error {
	minWait := cfg.OffCPUMin
	if minWait <= 0 {
		minWait = DefaultOffCPUMin
	}
	walks := cfg.OffCPUWalksPerSecond
	if walks == 0 {
		walks = DefaultOffCPUWalks
	}
	perWindow := uint32(0) // no sampling: every switch-out is walked
	if walks > 0 {
		perWindow = uint32(max(walks/10, 1)) // offcpu.h's windows are 100 ms
	}
	threads := cfg.OffCPUThreads
	if threads <= 0 {
		threads = DefaultOffCPUThreads
	}
	for name, v := range map[string]any{"offcpu_min_ns": uint64(minWait), "offcpu_walks_per_window": perWindow, "self_tgid": self} {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	// LRU maps are preallocated: one unused costs a slot, not thousands.
	spec.Maps["offcpu_starts"].MaxEntries, spec.Maps["go_parked"].MaxEntries = 1, 1
	if cfg.OffCPU {
		spec.Maps["offcpu_starts"].MaxEntries = uint32(threads)
		if cfg.OffCPUGoroutines {
			spec.Maps["go_parked"].MaxEntries = uint32(threads)
		}
	}
	return nil
}

// schedRange finds __schedule in kallsyms: an off-CPU sample's kernel stack starts with the
// tracepoint's plumbing, which user space cuts off there. Zero when kallsyms hides it.
func schedRange(path string) (start, end uint64) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 {
			continue
		}
		addr, err := strconv.ParseUint(fields[0], 16, 64)
		if err != nil {
			continue
		}
		if start != 0 {
			if addr > start {
				return start, addr
			}
			continue
		}
		if fields[2] == "__schedule" && (fields[1] == "t" || fields[1] == "T") && len(fields) == 3 {
			start = addr
		}
	}
	return 0, 0
}

// trimToSchedule drops the kernel frames above __schedule: the program and the
// tracepoint's plumbing, not where the thread waits.
func (p *offCPUPending) trimToSchedule(kernel []uint64) []uint64 {
	if p.schedStart == 0 {
		return kernel
	}
	for i, pc := range kernel {
		if pc >= p.schedStart && pc < p.schedEnd {
			return kernel[i:]
		}
	}
	return kernel
}

// attachOffCPU starts following context switches.
func (s *Sampler) attachOffCPU() error {
	s.offCPU.schedStart, s.offCPU.schedEnd = schedRange("/proc/kallsyms")
	l, err := link.AttachTracing(link.TracingOptions{Program: s.objs.OnSwitch})
	if err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("attach sched_switch: %w: %w", ErrNoOffCPU, err)
		}
		return classify("attach sched_switch", err)
	}
	s.links = append(s.links, l)
	return nil
}

// OffCPUCounters count the off-CPU program's work, summed over CPUs.
type OffCPUCounters struct {
	Switches uint64 // threads that went off the CPU to wait, of the processes profiled
	Walked   uint64 // of which had their stacks walked and sent
	Samples  uint64 // waits of at least the minimum, reported
	Short    uint64 // waits shorter than the minimum
	Lost     uint64 // records lost for want of room in the ring
	Stale    uint64 // waits of threads that exited with no return to the CPU seen
	// Goroutines that parked in Go's scheduler (OffCPUGoroutines), of which walked, and
	// of which ran again after at least the minimum.
	GoParks, GoWalked, GoSamples uint64
}

// offCPUStart is a walked switch-out waiting for its thread to come back: the sample, its
// frames copied out of the ring.
type offCPUStart struct {
	sample Sample
	start  uint64 // ktime_ns
	frames []uint64
	ctx    []byte
}

// goWait names a parked goroutine's walk: the thread it parked on and when.
type goWait struct {
	tid   uint32
	start uint64
}

// offCPUPending pairs walked switch-outs and goroutine parks with their ends (the
// reader's goroutine only).
type offCPUPending struct {
	byTID map[uint32]*offCPUStart
	byPID map[uint32]map[uint32]struct{}
	// goWaits are parked goroutines' walks; goPIDs counts them by process.
	goWaits map[goWait]*offCPUStart
	goPIDs  map[uint32]int
	// schedStart and schedEnd bound __schedule, where the kernel stacks are cut.
	schedStart, schedEnd uint64
}

// size is how many walks wait for their ends.
func (p *offCPUPending) size() int { return len(p.byTID) + len(p.goWaits) }

// holdGo keeps a parked goroutine's sample until it runs again. Goroutines may park for
// good (idle workers): past maxGoPending, any one held gives way.
func (p *offCPUPending) holdGo(sample *Sample, ktime uint64) {
	if p.goWaits == nil {
		p.goWaits, p.goPIDs = map[goWait]*offCPUStart{}, map[uint32]int{}
	}
	if len(p.goWaits) >= maxGoPending {
		for k := range p.goWaits {
			p.dropGo(k)
			break
		}
	}
	k := goWait{tid: sample.TID, start: ktime}
	if p.goWaits[k] != nil {
		p.dropGo(k)
	}
	st := &offCPUStart{}
	st.keep(sample, ktime, sample.Kernel)
	p.goWaits[k] = st
	p.goPIDs[sample.PID]++
}

func (p *offCPUPending) dropGo(k goWait) {
	st := p.goWaits[k]
	if st == nil {
		return
	}
	delete(p.goWaits, k)
	if p.goPIDs[st.sample.PID]--; p.goPIDs[st.sample.PID] <= 0 {
		delete(p.goPIDs, st.sample.PID)
	}
}

// keep copies a walk's sample out of the ring's buffer, with kernel as its kernel stack.
func (st *offCPUStart) keep(sample *Sample, ktime uint64, kernel []uint64) {
	st.start = ktime
	st.frames = append(append(st.frames[:0], sample.User...), kernel...)
	st.ctx = append(st.ctx[:0], sample.Context...)
	st.sample = *sample
	st.sample.User = st.frames[:len(sample.User):len(sample.User)]
	st.sample.Kernel = st.frames[len(sample.User):]
	st.sample.KernelErr = sample.KernelErr
	st.sample.Context = st.ctx
	st.sample.VMAs = nil
}

// hold keeps a switch-out's sample, replacing the thread's earlier one, whose wait was too
// short to be reported.
func (p *offCPUPending) hold(sample *Sample, ktime uint64) {
	if p.byTID == nil {
		p.byTID, p.byPID = map[uint32]*offCPUStart{}, map[uint32]map[uint32]struct{}{}
	}
	st := p.byTID[sample.TID]
	if st == nil {
		if len(p.byTID) >= maxOffCPUPending {
			for tid := range p.byTID { // any one: its thread has waited since, or is gone
				p.drop(tid)
				break
			}
		}
		st = &offCPUStart{}
		p.byTID[sample.TID] = st
	} else if st.sample.PID != sample.PID {
		delete(p.byPID[st.sample.PID], sample.TID)
	}
	tids := p.byPID[sample.PID]
	if tids == nil {
		tids = map[uint32]struct{}{}
		p.byPID[sample.PID] = tids
	}
	tids[sample.TID] = struct{}{}
	st.keep(sample, ktime, p.trimToSchedule(sample.Kernel))
}

func (p *offCPUPending) drop(tid uint32) {
	st := p.byTID[tid]
	if st == nil {
		return
	}
	delete(p.byTID, tid)
	if tids := p.byPID[st.sample.PID]; tids != nil {
		delete(tids, tid)
		if len(tids) == 0 {
			delete(p.byPID, st.sample.PID)
		}
	}
}

// forget drops the switch-outs and parked goroutines of a process that exited or
// exec'd, and reports whether it had goroutines parked.
func (p *offCPUPending) forget(pid uint32) (parked bool) {
	for tid := range p.byPID[pid] {
		delete(p.byTID, tid)
	}
	delete(p.byPID, pid)
	if p.goPIDs[pid] == 0 {
		return false
	}
	for k, st := range p.goWaits {
		if st.sample.PID == pid {
			p.dropGo(k)
		}
	}
	return true
}

// end returns the sample of the switch-out an end record closes, or nil.
func (p *offCPUPending) end(raw []byte) (*Sample, uint64) {
	if len(raw) < int(unsafe.Sizeof(samplerOffcpuEndEvent{})) {
		return nil, 0
	}
	e := (*samplerOffcpuEndEvent)(unsafe.Pointer(&raw[0]))
	if samplerEventKind(e.Kind) == samplerEventKindEVENT_GOPARK_END {
		k := goWait{tid: e.Tid, start: e.StartNs}
		st := p.goWaits[k]
		if st == nil || st.sample.PID != e.Pid {
			return nil, 0
		}
		p.dropGo(k)
		return &st.sample, e.WeightNs
	}
	st := p.byTID[e.Tid]
	if st == nil || st.start != e.StartNs || st.sample.PID != e.Pid {
		return nil, 0 // its switch-out was lost in a full ring, or evicted
	}
	p.drop(e.Tid)
	return &st.sample, e.WeightNs
}

// OffCPUState is how many waiting threads (and parked goroutines) the kernel and user
// space follow: both go back to where they were when they run again, exit or are
// forgotten.
type OffCPUState struct{ Kernel, User int }

// OffCPUState counts the waits followed now. User is as of the reader's last record: a
// gauge.
func (s *Sampler) OffCPUState() (OffCPUState, error) {
	st := OffCPUState{User: int(s.offPending.Load())}
	n, err := countEntries[uint32, samplerOffcpuStart](s.objs.OffcpuStarts)
	if err != nil {
		return st, fmt.Errorf("count waiting threads: %w", err)
	}
	st.Kernel = n
	if s.objs.OnGopark != nil {
		n, err := countEntries[samplerGoParkKey, samplerGoPark](s.objs.GoParked)
		if err != nil {
			return st, fmt.Errorf("count parked goroutines: %w", err)
		}
		st.Kernel += n
	}
	return st, nil
}

// countEntries counts a hash map's entries by iterating it.
func countEntries[K, V any](m *ebpf.Map) (int, error) {
	var (
		k K
		v V
		n int
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n, it.Err()
}

// OffCPUProgramStats is the kernel's accounting of the off-CPU program (needs
// CollectStats): it runs at every context switch.
func (s *Sampler) OffCPUProgramStats() (ProgramStats, error) {
	if s.objs.OnSwitch == nil {
		return ProgramStats{}, errors.New("read off-CPU program stats: off-CPU profiles are off")
	}
	st, err := s.objs.OnSwitch.Stats()
	if err != nil {
		return ProgramStats{}, fmt.Errorf("read off-CPU program stats: %w", err)
	}
	return ProgramStats{Runs: st.RunCount, Runtime: st.Runtime}, nil
}

// ErrNoGoroutines: the kernel cannot put uprobes on Go binaries (no uprobe PMU), which
// off-CPU profiles of goroutines need.
var ErrNoGoroutines = errors.New("kernel lacks uprobes (CONFIG_UPROBE_EVENTS) that off-CPU profiles of goroutines need")

// ProbeUprobes tells whether this kernel puts uprobes on files through perf_event_open
// (the uprobe PMU), which off-CPU profiles of goroutines need: tracefs is not.
func ProbeUprobes() error {
	if _, err := os.Stat("/sys/bus/event_source/devices/uprobe/type"); err != nil {
		return fmt.Errorf("%w: %w: %w", ErrNoGoroutines, ebpf.ErrNotSupported, err)
	}
	return nil
}

// AttachGoroutines attaches the goroutines' programs to a Go binary: at park, the file
// offset of runtime.gopark's code where it is attached, and at execute, runtime.execute's.
// path names the file for the kernel (a /proc/self/fd link serves). Close detaches them.
func (s *Sampler) AttachGoroutines(path string, park, execute uint64) (io.Closer, error) {
	if s.objs.OnGopark == nil {
		return nil, errors.New("attach goroutine probes: off-CPU profiles of goroutines are off")
	}
	ex, err := link.OpenExecutable(path)
	if err != nil {
		return nil, fmt.Errorf("attach goroutine probes: %w", err)
	}
	var links goroutineLinks
	for _, p := range []struct {
		prog *ebpf.Program
		off  uint64
		name string
	}{{s.objs.OnGopark, park, "runtime.gopark"}, {s.objs.OnExecute, execute, "runtime.execute"}} {
		l, err := ex.Uprobe(p.name, p.prog, &link.UprobeOptions{Address: p.off})
		if err != nil {
			links.Close()
			if errors.Is(err, ebpf.ErrNotSupported) {
				err = fmt.Errorf("%w: %w", ErrNoGoroutines, err)
			}
			return nil, classify("attach uprobe "+p.name, err)
		}
		links = append(links, l)
	}
	return links, nil
}

type goroutineLinks []link.Link

func (ls goroutineLinks) Close() error {
	var errs []error
	for _, l := range ls {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}

// forgetParked deletes the goroutines a process that exited or exec'd left parked in the
// kernel's map, so that its fill level says what waits now.
func (s *Sampler) forgetParked(pid uint32) {
	if s.objs.GoParked == nil {
		return
	}
	var (
		k    samplerGoParkKey
		v    samplerGoPark
		dead []samplerGoParkKey
	)
	it := s.objs.GoParked.Iterate()
	for it.Next(&k, &v) {
		if k.Pid == pid {
			dead = append(dead, k)
		}
	}
	for _, k := range dead {
		s.objs.GoParked.Delete(k)
	}
}
