package bpf

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// pollEvery is how long records may wait in the ring before the reader collects them:
// until the rate's next redraw (ditherEvery), at most maxPoll. The kernel wakes the
// reader sooner for a full ring, a process it does not know and the processes' events.
// Each wake-up costs the Go scheduler and its monitor thread more than reading the
// records: at the host-wide 19 Hz the reader woke every 200 ms, now every 526 ms.
func pollEvery(frequency int) time.Duration { return min(ditherEvery(frequency), maxPoll) }

const maxPoll = time.Second

// Config holds the load-time settings of the kernel programs.
type Config struct {
	// PIDs, when not empty, restricts sampling to these thread groups; the check runs in the kernel.
	PIDs []uint32
	// CgroupFilter restricts sampling to processes in the cgroups Cgroups names and those
	// AddCgroup adds later, and in their descendants, by cgroup v2 id. With PIDs too,
	// a process either names is sampled.
	CgroupFilter bool
	Cgroups      []uint64
	// MaxCgroups sizes the cgroup filter for ids added later; at least len(Cgroups).
	MaxCgroups int
	// Frequency is the sampling rate per CPU, in Hz.
	Frequency int
	// KernelStacks records kernel stacks too.
	KernelStacks bool
	// RingBufferBytes sizes the ring buffer; 0 sizes it for about a second of samples.
	RingBufferBytes int
	// CollectStats turns on the kernel's BPF run-time statistics while the sampler runs.
	CollectStats bool
	// FramePointersOnly walks user stacks by frame pointer (bpf_get_stack) instead of by
	// unwind tables. Architectures whose unwind tables sonde cannot read yet always do.
	FramePointersOnly bool
	// MaxTables bounds how many files' unwind tables the kernel holds at once.
	MaxTables int
	// MaxProcesses bounds how many processes' mappings the kernel unwinder holds.
	MaxProcesses int
	// Runtimes are the language runtimes whose maps the loader sizes (runtimes.h).
	Runtimes []RuntimeMaps
	// FollowForks makes the children of PIDs targets too, from the fork on, and their
	// children in turn, at most MaxFollowed alive at once: a command and all it starts.
	FollowForks bool
	// LazyProcessEvents lets exec and exit events wait for the reader's next poll instead
	// of waking it: for a reader that reads a process only after a grace anyway.
	LazyProcessEvents bool
	// OffCPU records where threads wait (off-CPU samples) beside the CPU samples.
	OffCPU bool
	// OffCPUMin is the shortest wait recorded; 0 means DefaultOffCPUMin.
	OffCPUMin time.Duration
	// OffCPUWalksPerSecond is how many switch-outs each CPU walks per second before it
	// walks a random sample of them, weighted to keep totals right; 0 means
	// DefaultOffCPUWalks, less than 0 walks every one.
	OffCPUWalksPerSecond int
	// OffCPUThreads bounds the waiting threads the kernel follows at once; 0 means
	// DefaultOffCPUThreads. It bounds the parked goroutines followed too.
	OffCPUThreads int
	// OffCPUGoroutines (with OffCPU) loads the programs that record where goroutines wait
	// in Go's scheduler; AttachGoroutines attaches them to a Go binary.
	OffCPUGoroutines bool
}

// MaxFollowed bounds the targets alive at once with FollowForks: the PID filter is a
// preallocated map (the sampling program may not allocate), 8192 entries of a few dozen
// bytes. Forks past it run unsampled.
const MaxFollowed = 8192

// TableUnwinding reports whether the kernel walks user stacks with unwind tables under
// cfg: on an architecture the table walker supports, unless frame pointers were asked for.
func (cfg Config) TableUnwinding() bool { return tableUnwinding && !cfg.FramePointersOnly }

// Sample is one stack sample as the kernel recorded it. The slices alias a buffer that
// is reused: a Handler must copy what it keeps.
type Sample struct {
	PID, TID uint32
	CPU      uint32
	Comm     string // the thread's name
	Time     time.Time
	User     []uint64 // leaf first
	Kernel   []uint64 // leaf first
	// ExecID is the thread group's self_exec_id: which of the pid's execs the user
	// addresses belong to.
	ExecID uint64
	// UserErr and KernelErr are set when the kernel could not walk that stack.
	UserErr, KernelErr error
	// UnwindEnd says how the user stack walk ended.
	UnwindEnd UnwindEnd
	// ContextSource says who published the trace context the thread was in, and Context
	// is it as the kernel copied it (see ContextSource's values); ContextNone: none.
	ContextSource ContextSource
	Context       []byte
	// VMAs are the mappings the user frames lie in, named by the kernel when user space
	// had not described the image to it yet; nil otherwise.
	VMAs []VMA
	// OffCPU, when not 0, makes this an off-CPU sample: the stacks as the thread went off
	// the CPU at Time, and the nanoseconds it waited (scaled when switch-outs were
	// sampled). A CPU sample has 0.
	OffCPU uint64
}

// ProcessEventKind says what happened to a process.
type ProcessEventKind int

const (
	ProcessExec ProcessEventKind = iota + 1
	ProcessExit
)

// ProcessEvent reports an exec or an exit of a sampled process.
type ProcessEvent struct {
	Kind ProcessEventKind
	PID  uint32
	Time time.Time
	// ExecID is the process's self_exec_id after the event: after an exec, the samples
	// that carry it belong to the new image.
	ExecID uint64
}

// Handler receives what the kernel records, in ring-buffer order, from one goroutine.
type Handler interface {
	HandleSample(*Sample)
	HandleProcessEvent(ProcessEvent)
}

// Poller is a Handler that is also told when the reader has drained the ring, with the
// time: work due every so often can ride on the reader's wake-ups instead of adding its
// own, each of which costs an idle agent's Go scheduler more than the work.
type Poller interface {
	Polled(now time.Time)
}

// Counters are the kernel-side counts, summed over CPUs.
type Counters struct {
	Samples, RingBufferFull, UserStackErrors, KernelStackErrors, ProcessEvents uint64
	// StaleMappings counts samples whose process had exec'd since user space described
	// its mappings: walked by frame pointer.
	StaleMappings uint64
	// UnwindEnds counts user-stack walks by how they ended, indexed by UnwindEnd.
	UnwindEnds [UnwindEndCount]uint64
	// Context counts the trace contexts read.
	Context ContextCounters
	// OffCPU counts the off-CPU program's work.
	OffCPU OffCPUCounters
}

// ProgramStats is the kernel's accounting of the sampling program (needs CollectStats).
type ProgramStats struct {
	Runs    uint64
	Runtime time.Duration
}

// Sampler owns the loaded programs, their perf events and the ring buffer reader.
type Sampler struct {
	objs      samplerObjects
	spec      *ebpf.CollectionSpec // as loaded, its maps and types only: for RuntimeKernel's checks, until SealRuntimes
	maps      map[string]*ebpf.Map // objs' maps by name, for the runtimes' writers
	perfFDs   []int
	links     []link.Link
	ring      *ringbuf.Reader
	stats     io.Closer
	monoStart time.Duration
	wallStart time.Time
	closeOnce sync.Once

	cpus      []int
	frequency int
	dither    float64   // the last draw of ditherPeriod, to be mirrored next; 0 after a mirror
	redrawAt  time.Time // when ditherPeriod draws again
	ringBytes atomic.Uint64
	polls     atomic.Uint64 // reads of the ring buffer that worked, records or not
	lastPoll  atomic.Int64  // unix nanoseconds of the latest

	// interpMu serialises the read-modify-write of interp_procs entries, which several
	// runtimes' trackers share.
	interpMu sync.Mutex
	offCPU   offCPUPending // the reader's only
	// offPending publishes offCPU's size to other goroutines.
	offPending atomic.Int64
	tablesMu   sync.Mutex
	slots      tableSlots
	// procGen numbers each writing of a process's mappings (proc_info.gen): what the
	// kernel's walks remember of the mappings holds only while the number does.
	procGen atomic.Uint32

	pending     []pendingContext // by CPU; only Run's goroutine touches it
	pendingVMAs []pendingVMAs    // by CPU, likewise
}

// ringBufferSize returns a power-of-two size holding about a second of samples.
func ringBufferSize(frequency, cpus int) int {
	const minSize, maxSize = 256 << 10, 64 << 20
	want := frequency * cpus * int(unsafe.Sizeof(samplerSampleEvent{}))
	size := 1 << bits.Len(uint(max(want, 1)-1))
	return min(max(size, minSize), maxSize)
}

// Load loads the programs, fills the PID filter and attaches the process tracepoints;
// Start starts sampling.
func Load(cfg Config) (*Sampler, error) {
	if cfg.Frequency <= 0 {
		return nil, fmt.Errorf("frequency %d Hz: must be positive", cfg.Frequency)
	}
	if err := CheckFeatures(); err != nil {
		return nil, err
	}
	cpus, err := OnlineCPUs()
	if err != nil {
		return nil, err
	}
	spec, err := loadSampler()
	if err != nil {
		return nil, fmt.Errorf("read embedded bpf object: %w", err)
	}
	if err := spec.Variables["filter_pids"].Set(boolByte(len(cfg.PIDs) > 0)); err != nil {
		return nil, fmt.Errorf("set filter_pids: %w", err)
	}
	cgroupFilter := cfg.CgroupFilter || len(cfg.Cgroups) > 0
	if err := spec.Variables["filter_cgroups"].Set(boolByte(cgroupFilter)); err != nil {
		return nil, fmt.Errorf("set filter_cgroups: %w", err)
	}
	spec.Maps["target_cgroups"].MaxEntries = uint32(max(len(cfg.Cgroups), cfg.MaxCgroups, 1))
	if err := spec.Variables["collect_kernel"].Set(boolByte(cfg.KernelStacks)); err != nil {
		return nil, fmt.Errorf("set collect_kernel: %w", err)
	}
	if err := spec.Variables["table_unwinding"].Set(boolByte(cfg.TableUnwinding())); err != nil {
		return nil, fmt.Errorf("set table_unwinding: %w", err)
	}
	if err := spec.Variables["vma_hints"].Set(boolByte(cfg.TableUnwinding())); err != nil {
		return nil, fmt.Errorf("set vma_hints: %w", err)
	}
	if err := spec.Variables["lazy_process_events"].Set(boolByte(cfg.LazyProcessEvents)); err != nil {
		return nil, fmt.Errorf("set lazy_process_events: %w", err)
	}
	spec.Maps["target_pids"].MaxEntries = uint32(max(len(cfg.PIDs), 1))
	if cfg.FollowForks {
		if err := spec.Variables["follow_forks"].Set(uint8(1)); err != nil {
			return nil, fmt.Errorf("set follow_forks: %w", err)
		}
		spec.Maps["target_pids"].MaxEntries = uint32(max(len(cfg.PIDs), MaxFollowed))
	}
	maxTables := cmp.Or(cfg.MaxTables, DefaultMaxTables)
	spec.Maps["unwind_tables"].MaxEntries = uint32(maxTables)
	spec.Maps["go_runtimes"].MaxEntries = uint32(maxTables)
	maxProcs := uint32(cmp.Or(cfg.MaxProcesses, DefaultMaxProcesses))
	spec.Maps["proc_maps"].MaxEntries = maxProcs
	spec.Maps["exec_ids"].MaxEntries = maxProcs
	spec.Maps["tracectx_procs"].MaxEntries = maxProcs
	spec.Maps["interp_procs"].MaxEntries = maxProcs
	if err := sizeRuntimes(spec, cfg.Runtimes, maxProcs); err != nil {
		return nil, err
	}
	ringSize := cfg.RingBufferBytes
	if ringSize == 0 {
		ringSize = ringBufferSize(cfg.Frequency, len(cpus))
	}
	spec.Maps["events"].MaxEntries = uint32(ringSize)
	if err := spec.Variables["ring_wakeup_bytes"].Set(uint64(ringSize / 4)); err != nil {
		return nil, fmt.Errorf("set ring_wakeup_bytes: %w", err)
	}

	if err := spec.Variables["tracectx_stats"].Set(boolByte(cfg.CollectStats)); err != nil {
		return nil, fmt.Errorf("set tracectx_stats: %w", err)
	}
	if err := setOffCPU(spec, cfg, uint32(os.Getpid())); err != nil {
		return nil, err
	}
	s := &Sampler{slots: tableSlots{max: uint32(maxTables)}}
	if cfg.CollectStats {
		if s.stats, err = ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err != nil {
			return nil, classify("enable bpf stats", err)
		}
	}
	if err := s.load(spec, cfg.OffCPU, cfg.OffCPU && cfg.OffCPUGoroutines); err != nil {
		s.Close()
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load bpf programs: %+v", verr)
		}
		return nil, classify("load bpf programs", err)
	}
	for _, pid := range cfg.PIDs {
		if err := s.objs.TargetPids.Put(pid, uint8(1)); err != nil {
			s.Close()
			return nil, fmt.Errorf("add pid %d to filter: %w", pid, err)
		}
	}
	for _, id := range cfg.Cgroups {
		if err := s.AddCgroup(id); err != nil {
			s.Close()
			return nil, err
		}
	}
	if s.ring, err = ringbuf.NewReader(s.objs.Events); err != nil {
		s.Close()
		return nil, classify("open ring buffer", err)
	}
	for name, prog := range map[string]*ebpf.Program{"sched_process_exec": s.objs.OnExec, "sched_process_exit": s.objs.OnExit} {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: name, Program: prog})
		if err != nil {
			s.Close()
			return nil, classify("attach raw tracepoint "+name, err)
		}
		s.links = append(s.links, l)
	}
	if cfg.OffCPU {
		if err := s.attachOffCPU(); err != nil {
			s.Close()
			return nil, err
		}
		if cfg.OffCPUGoroutines {
			if err := ProbeUprobes(); err != nil {
				s.Close()
				return nil, err
			}
		}
	}
	if cfg.FollowForks {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "sched_process_fork", Program: s.objs.OnFork})
		if err != nil {
			s.Close()
			return nil, classify("attach raw tracepoint sched_process_fork", err)
		}
		s.links = append(s.links, l)
	}
	s.monoStart, s.wallStart = monotonicNow(), time.Now().Round(0)
	s.cpus, s.frequency = cpus, cfg.Frequency
	return s, nil
}

// Start begins sampling on every online CPU. Between Load and Start, tables and process
// mappings can be written so the first samples already use them.
func (s *Sampler) Start() error {
	for _, cpu := range s.cpus {
		fd, err := openCPUClock(cpu, s.frequency, s.objs.Sample.FD())
		if err != nil {
			return err
		}
		s.perfFDs = append(s.perfFDs, fd)
	}
	return nil
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

func monotonicNow() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// openCPUClock opens the software cpu-clock event on one CPU in frequency mode and runs prog on it.
func openCPUClock(cpu, frequency, progFD int) (int, error) {
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_CPU_CLOCK,
		Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Sample: uint64(frequency),
		Bits:   unix.PerfBitFreq | unix.PerfBitDisabled,
	}
	fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return -1, classify(fmt.Sprintf("open cpu-clock event on cpu %d", cpu), err)
	}
	if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_SET_BPF, progFD); err != nil {
		unix.Close(fd)
		return -1, classify(fmt.Sprintf("attach sampler to cpu %d", cpu), err)
	}
	if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
		unix.Close(fd)
		return -1, classify(fmt.Sprintf("enable cpu-clock event on cpu %d", cpu), err)
	}
	return fd, nil
}

// Run delivers records to h until ctx is cancelled; then it stops sampling and delivers
// what the ring still holds before returning.
//
// The reader waits for the ring in Go's network poller rather than in a blocking
// epoll_wait: a goroutine blocked in a system call holds its P, and the runtime's
// monitor thread (sysmon) takes the P back after 10 ms and then polls every 20 µs
// for a millisecond, as if work had started; at one wait per poll interval that was
// a fifth of a core-millisecond each second, the largest share of an idle agent's CPU.
func (s *Sampler) Run(ctx context.Context, h Handler) error {
	w, err := newRingWaiter(s.objs.Events.FD())
	if err != nil {
		return s.runBlocking(ctx, h)
	}
	defer w.close()
	stop := context.AfterFunc(ctx, func() {
		s.stopSampling()
		w.interrupt()
	})
	defer stop()
	// A deadline in the past makes a read return as soon as the ring is empty: the
	// waiting is done by w.
	s.ring.SetDeadline(time.Unix(1, 0))
	var (
		rec    ringbuf.Record
		sample Sample
	)
	poller, _ := h.(Poller)
	for {
		for {
			err := s.ring.ReadInto(&rec)
			if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, ringbuf.ErrFlushed) {
				break
			}
			if err != nil {
				return fmt.Errorf("read ring buffer: %w", err)
			}
			s.ringBytes.Add(uint64(len(rec.RawSample)))
			s.dispatch(rec.RawSample, &sample, h)
		}
		now := time.Now()
		s.polls.Add(1)
		s.lastPoll.Store(now.UnixNano())
		if ctx.Err() != nil {
			return nil // sampling stopped before the last drain
		}
		if poller != nil {
			poller.Polled(now)
		}
		// The kernel wakes the reader only when the ring fills up or a process it does
		// not know appears; otherwise records are collected at the rate's next redraw.
		if err := w.wait(pollEvery(s.frequency)); err != nil {
			return fmt.Errorf("wait for ring buffer: %w", err)
		}
		s.ditherPeriod(time.Now())
	}
}

// runBlocking is Run for a ring whose descriptor Go's poller refused: the reader blocks
// in cilium/ebpf's epoll_wait.
func (s *Sampler) runBlocking(ctx context.Context, h Handler) error {
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
			s.stopSampling()
			// Flush wakes a blocked read; records already in the ring are delivered before ErrFlushed.
			_ = s.ring.Flush()
		case <-stopped:
		}
	}()
	var (
		rec    ringbuf.Record
		sample Sample
	)
	poller, _ := h.(Poller)
	for {
		if poller != nil {
			poller.Polled(time.Now()) // every record: the deadline passes only when none come
		}
		s.ring.SetDeadline(time.Now().Add(pollEvery(s.frequency)))
		err := s.ring.ReadInto(&rec)
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, ringbuf.ErrFlushed) {
			s.polls.Add(1)
			s.lastPoll.Store(time.Now().UnixNano())
		}
		switch {
		case errors.Is(err, ringbuf.ErrFlushed) && ctx.Err() != nil:
			return nil
		case errors.Is(err, ringbuf.ErrFlushed), errors.Is(err, os.ErrDeadlineExceeded):
			s.ditherPeriod(time.Now())
			continue
		case err != nil:
			return fmt.Errorf("read ring buffer: %w", err)
		}
		s.ringBytes.Add(uint64(len(rec.RawSample)))
		s.dispatch(rec.RawSample, &sample, h)
	}
}

func (s *Sampler) dispatch(raw []byte, sample *Sample, h Handler) {
	if len(raw) < 4 {
		return
	}
	switch kind := samplerEventKind(*(*uint32)(unsafe.Pointer(&raw[0]))); kind {
	case samplerEventKindEVENT_SAMPLE, samplerEventKindEVENT_OFFCPU, samplerEventKindEVENT_GOPARK:
		// Records end after their last frame: only the header is sure to be there.
		if len(raw) < headerSize {
			return
		}
		e := (*samplerSampleEvent)(unsafe.Pointer(&raw[0]))
		*sample = Sample{
			PID:    e.Pid,
			TID:    e.Tid,
			CPU:    e.Cpu,
			Comm:   commString(&e.Comm),
			Time:   s.wallTime(e.KtimeNs),
			ExecID: e.ExecId,
		}
		frames := unsafe.Slice((*uint64)(unsafe.Pointer(&raw[headerSize])), (len(raw)-headerSize)/8)
		sample.User, sample.UserErr = stackSlice(frames, e.UserLen, MaxUserDepth)
		sample.Kernel, sample.KernelErr = stackSlice(frames[len(sample.User):], e.KernelLen, MaxKernelDepth)
		sample.UnwindEnd = UnwindEnd(e.UnwindEnd)
		sample.ContextSource, sample.Context = s.takeContext(e.Cpu, e.KtimeNs)
		sample.VMAs = s.takeVMAs(e.Cpu, e.KtimeNs)
		switch kind {
		case samplerEventKindEVENT_OFFCPU:
			// Held until the thread runs again and says how long it waited.
			s.offCPU.hold(sample, e.KtimeNs)
			s.offPending.Store(int64(s.offCPU.size()))
			return
		case samplerEventKindEVENT_GOPARK:
			s.offCPU.holdGo(sample, e.KtimeNs)
			s.offPending.Store(int64(s.offCPU.size()))
			return
		}
		h.HandleSample(sample)
	case samplerEventKindEVENT_OFFCPU_END, samplerEventKindEVENT_GOPARK_END:
		off, weight := s.offCPU.end(raw)
		s.offPending.Store(int64(s.offCPU.size()))
		if off != nil && weight > 0 {
			off.OffCPU = weight
			h.HandleSample(off)
		}
	case samplerEventKindEVENT_CONTEXT:
		s.holdContext(raw)
	case samplerEventKindEVENT_VMAS:
		s.holdVMAs(raw)
	case samplerEventKindEVENT_EXEC, samplerEventKindEVENT_EXIT:
		if len(raw) < int(unsafe.Sizeof(samplerProcessEvent{})) {
			return
		}
		e := (*samplerProcessEvent)(unsafe.Pointer(&raw[0]))
		kind := ProcessExec
		if samplerEventKind(e.Kind) == samplerEventKindEVENT_EXIT {
			kind = ProcessExit
		}
		if s.offCPU.forget(e.Pid) {
			s.forgetParked(e.Pid)
		}
		s.offPending.Store(int64(s.offCPU.size()))
		h.HandleProcessEvent(ProcessEvent{Kind: kind, PID: e.Pid, Time: s.wallTime(e.KtimeNs), ExecID: e.ExecId})
	}
}

// wallTime converts the kernel's monotonic time to wall-clock time. The anchor is renewed
// every second so that the wall clock's adjustments (NTP) are followed, not accumulated.
func (s *Sampler) wallTime(ktimeNs uint64) time.Time {
	if time.Duration(ktimeNs)-s.monoStart > time.Second {
		s.monoStart, s.wallStart = monotonicNow(), time.Now().Round(0)
	}
	return s.wallStart.Add(time.Duration(ktimeNs) - s.monoStart)
}

// stackSlice turns a stack walk's result (bytes written, or -errno) into frames.
func stackSlice(frames []uint64, n int32, limit int) ([]uint64, error) {
	if n < 0 {
		return nil, unix.Errno(-n)
	}
	return frames[:min(int(n)/8, limit, len(frames))], nil
}

func commString(c *[16]int8) string {
	b := unsafe.Slice((*byte)(unsafe.Pointer(&c[0])), len(c))
	for i, ch := range b {
		if ch == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// AddCgroup adds a cgroup to the kernel's filter: its processes and those of the cgroups
// below it are sampled from now on.
func (s *Sampler) AddCgroup(id uint64) error {
	if err := s.objs.TargetCgroups.Put(id, uint8(1)); err != nil {
		return fmt.Errorf("add cgroup %d to filter: %w", id, err)
	}
	return nil
}

// RemoveCgroup takes a cgroup out of the kernel's filter.
func (s *Sampler) RemoveCgroup(id uint64) error {
	if err := s.objs.TargetCgroups.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("remove cgroup %d from filter: %w", id, err)
	}
	return nil
}

// Polls is how many reads of the ring buffer have worked so far, whether they found
// records or waited out the poll interval; LastPoll is when the latest did. A reader that
// stopped or stalls stops them.
func (s *Sampler) Polls() uint64 { return s.polls.Load() }

// LastPoll is when the ring buffer was last read.
func (s *Sampler) LastPoll() time.Time { return time.Unix(0, s.lastPoll.Load()) }

// RingBytes is how many bytes of records the reader has taken from the ring buffer.
func (s *Sampler) RingBytes() uint64 { return s.ringBytes.Load() }

// RingBufferFull is Counters().RingBufferFull alone: one map read where Counters
// makes some forty, for a caller that checks it every second.
func (s *Sampler) RingBufferFull() (uint64, error) {
	return perCPUSum(s.objs.Counters, uint32(samplerCounterCOUNTER_RINGBUF_FULL))
}

// Counters sums the kernel-side counters over all CPUs.
func (s *Sampler) Counters() (Counters, error) {
	var out Counters
	fields := map[samplerCounter]*uint64{
		samplerCounterCOUNTER_SAMPLES:          &out.Samples,
		samplerCounterCOUNTER_RINGBUF_FULL:     &out.RingBufferFull,
		samplerCounterCOUNTER_USER_STACK_ERR:   &out.UserStackErrors,
		samplerCounterCOUNTER_KERNEL_STACK_ERR: &out.KernelStackErrors,
		samplerCounterCOUNTER_PROCESS_EVENTS:   &out.ProcessEvents,
		samplerCounterCOUNTER_STALE_MAPPINGS:   &out.StaleMappings,
		samplerCounterCOUNTER_OFFCPU_SWITCHES:  &out.OffCPU.Switches,
		samplerCounterCOUNTER_OFFCPU_WALKED:    &out.OffCPU.Walked,
		samplerCounterCOUNTER_OFFCPU_SAMPLES:   &out.OffCPU.Samples,
		samplerCounterCOUNTER_OFFCPU_SHORT:     &out.OffCPU.Short,
		samplerCounterCOUNTER_OFFCPU_LOST:      &out.OffCPU.Lost,
		samplerCounterCOUNTER_OFFCPU_STALE:     &out.OffCPU.Stale,
		samplerCounterCOUNTER_GOPARKS:          &out.OffCPU.GoParks,
		samplerCounterCOUNTER_GOPARKS_WALKED:   &out.OffCPU.GoWalked,
		samplerCounterCOUNTER_GOPARK_SAMPLES:   &out.OffCPU.GoSamples,
	}
	for i := range out.UnwindEnds {
		fields[samplerCounterCOUNTER_UNWIND_BASE+samplerCounter(i)] = &out.UnwindEnds[i]
	}
	for i, field := range fields {
		v, err := perCPUSum(s.objs.Counters, uint32(i))
		if err != nil {
			return out, fmt.Errorf("read counter %d: %w", i, err)
		}
		*field += v
	}
	var err error
	out.Context, err = s.contextCounters()
	return out, err
}

// Defaults for the unwinder's maps: a slot for each of 16384 files' tables (the slots
// cost 8 bytes each; tables themselves are created as files appear and freed as they go),
// and mappings for 8192 processes, allocated as processes appear.
const (
	DefaultMaxTables    = 1 << 14
	DefaultMaxProcesses = 8192
)

// ProgramStats reports how often the sampling program ran and for how long in total.
func (s *Sampler) ProgramStats() (ProgramStats, error) {
	st, err := s.objs.Sample.Stats()
	if err != nil {
		return ProgramStats{}, fmt.Errorf("read sampler program stats: %w", err)
	}
	return ProgramStats{Runs: st.RunCount, Runtime: st.Runtime}, nil
}

// ditherPeriod draws the CPUs' next sampling rate at random around the frequency. A fixed
// period samples a loop whose cycle is near one of its multiples at the same few phases,
// for seconds: a Go program spending 60 % of its time in one function and 40 % in another
// read as 0.55 to 0.73 from one run to the next at 199 Hz (995 samples each, where chance
// alone gives ±0.03); redrawn every 200 ms, 0.56 to 0.66; every 50 ms, 0.58 to 0.63. The
// rate is drawn evenly between half and one and a half times the frequency, every other
// draw the mirror of the one before, so that the rate over two draws is the one asked
// for. Each redraw is one ioctl per CPU, and an interrupt of each CPU to apply it: a
// poll that comes early (a full ring, a new process) does not redraw before its time.
func (s *Sampler) ditherPeriod(now time.Time) {
	if now.Before(s.redrawAt) {
		return
	}
	s.redrawAt = now.Add(ditherEvery(s.frequency) * 9 / 10) // a poll may come a little early
	period := s.nextPeriod()
	for _, fd := range s.perfFDs {
		_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.PERF_EVENT_IOC_PERIOD, uintptr(unsafe.Pointer(&period)))
	}
}

// nextPeriod draws the next period, in nanoseconds, for ditherPeriod.
func (s *Sampler) nextPeriod() uint64 {
	d := -s.dither
	if d == 0 {
		d = rand.Float64() - 0.5
		s.dither = d
	} else {
		s.dither = 0
	}
	return uint64(float64(time.Second) / (float64(s.frequency) * (1 + d)))
}

// ditherEvery is how often the rate is redrawn: after about ten samples, so that no run of
// samples at one period is long enough to lock onto a loop, but no more often than every
// 20 ms. At the host-wide default (19 Hz) that is every 526 ms (redrawn at every 200 ms
// poll, it was 3.5–5.6 % of a steady agent's CPU); with --pid at 199 Hz, every 50 ms.
func ditherEvery(frequency int) time.Duration {
	return max(10*time.Second/time.Duration(max(frequency, 1)), 20*time.Millisecond)
}

func (s *Sampler) stopSampling() {
	for _, fd := range s.perfFDs {
		_ = unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_DISABLE, 0)
	}
}

// Close detaches and unloads everything. It is safe to call more than once.
func (s *Sampler) Close() error {
	s.closeOnce.Do(func() {
		s.stopSampling()
		for _, fd := range s.perfFDs {
			unix.Close(fd)
		}
		for _, l := range s.links {
			l.Close()
		}
		if s.ring != nil {
			s.ring.Close()
		}
		s.objs.Close()
		if s.stats != nil {
			s.stats.Close()
		}
	})
	return nil
}

// coreObjects are the sampler's maps and the programs every run attaches.
type coreObjects struct {
	samplerMaps
	OnExec *ebpf.Program `ebpf:"on_exec"`
	OnExit *ebpf.Program `ebpf:"on_exit"`
	OnFork *ebpf.Program `ebpf:"on_fork"`
	Sample *ebpf.Program `ebpf:"sample"`
}

// offCPUObjects add the off-CPU program; goroutineObjects, the goroutines' programs.
type offCPUObjects struct {
	coreObjects
	OnSwitch *ebpf.Program `ebpf:"on_switch"`
}

type goroutineObjects struct {
	offCPUObjects
	OnGopark  *ebpf.Program `ebpf:"on_gopark"`
	OnExecute *ebpf.Program `ebpf:"on_execute"`
}

// load loads the maps and programs into the kernel, the off-CPU programs only when they
// are attached: they walk stacks as the sampling program does, and take as long to verify
// (tens of ms of CPU at every start).
func (s *Sampler) load(spec *ebpf.CollectionSpec, offCPU, goroutines bool) error {
	var all goroutineObjects
	var err error
	switch {
	case goroutines:
		err = spec.LoadAndAssign(&all, nil)
	case offCPU:
		err = spec.LoadAndAssign(&all.offCPUObjects, nil)
	default:
		err = spec.LoadAndAssign(&all.coreObjects, nil)
	}
	if err != nil {
		return err
	}
	c := all.coreObjects
	s.objs.samplerMaps = c.samplerMaps
	s.objs.samplerPrograms = samplerPrograms{OnExec: c.OnExec, OnExit: c.OnExit, OnFork: c.OnFork,
		OnSwitch: all.OnSwitch, OnGopark: all.OnGopark, OnExecute: all.OnExecute, Sample: c.Sample}
	// Of the spec, the runtimes' checks need the maps' and types' BTF only: its programs'
	// instructions and line information, 3 MB of heap, go once loaded.
	s.spec = &ebpf.CollectionSpec{Maps: spec.Maps, Types: spec.Types}
	s.maps = mapsByName(&s.objs.samplerMaps)
	return nil
}

// mapsByName indexes the maps of a bpf2go struct by their names in the kernel program.
func mapsByName(maps *samplerMaps) map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	v := reflect.ValueOf(maps).Elem()
	for i := range v.NumField() {
		if name := v.Type().Field(i).Tag.Get("ebpf"); name != "" {
			if m, ok := v.Field(i).Interface().(*ebpf.Map); ok && m != nil {
				out[name] = m
			}
		}
	}
	return out
}

// perCPUSum reads entry i of a per-CPU counters map, summed over CPUs.
func perCPUSum(m *ebpf.Map, i uint32) (uint64, error) {
	var perCPU []uint64
	if err := m.Lookup(i, &perCPU); err != nil {
		return 0, err
	}
	var sum uint64
	for _, v := range perCPU {
		sum += v
	}
	return sum, nil
}
