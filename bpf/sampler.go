package bpf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// MaxStackDepth is the deepest stack the kernel records per sample, user and kernel each.
const MaxStackDepth = len(samplerSampleEvent{}.User)

// Config holds the load-time settings of the kernel programs.
type Config struct {
	// PIDs, when not empty, restricts sampling to these thread groups; the check runs in the kernel.
	PIDs []uint32
	// Frequency is the sampling rate per CPU, in Hz.
	Frequency int
	// KernelStacks records kernel stacks too.
	KernelStacks bool
	// RingBufferBytes sizes the ring buffer; 0 sizes it for about a second of samples.
	RingBufferBytes int
	// CollectStats turns on the kernel's BPF run-time statistics while the sampler runs.
	CollectStats bool
}

// Sample is one stack sample as the kernel recorded it. The slices alias a buffer that
// is reused: a Handler must copy what it keeps.
type Sample struct {
	PID, TID uint32
	CPU      uint32
	Comm     string // the thread's name
	Time     time.Time
	User     []uint64 // leaf first
	Kernel   []uint64 // leaf first
	// UserErr and KernelErr are set when the kernel could not walk that stack.
	UserErr, KernelErr error
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
}

// Handler receives what the kernel records, in ring-buffer order, from one goroutine.
type Handler interface {
	HandleSample(*Sample)
	HandleProcessEvent(ProcessEvent)
}

// Counters are the kernel-side counts, summed over CPUs.
type Counters struct {
	Samples, RingBufferFull, UserStackErrors, KernelStackErrors, ProcessEvents uint64
}

// ProgramStats is the kernel's accounting of the sampling program (needs CollectStats).
type ProgramStats struct {
	Runs    uint64
	Runtime time.Duration
}

// Sampler owns the loaded programs, their perf events and the ring buffer reader.
type Sampler struct {
	objs      samplerObjects
	perfFDs   []int
	links     []link.Link
	ring      *ringbuf.Reader
	stats     io.Closer
	monoStart time.Duration
	wallStart time.Time
	closeOnce sync.Once
}

// ringBufferSize returns a power-of-two size holding about a second of samples.
func ringBufferSize(frequency, cpus int) int {
	const minSize, maxSize = 256 << 10, 64 << 20
	want := frequency * cpus * int(unsafe.Sizeof(samplerSampleEvent{}))
	size := 1 << bits.Len(uint(max(want, 1)-1))
	return min(max(size, minSize), maxSize)
}

// Load loads the programs, fills the PID filter and starts sampling on every online CPU.
func Load(cfg Config) (*Sampler, error) {
	if cfg.Frequency <= 0 {
		return nil, fmt.Errorf("frequency %d Hz: must be positive", cfg.Frequency)
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
	if err := spec.Variables["collect_kernel"].Set(boolByte(cfg.KernelStacks)); err != nil {
		return nil, fmt.Errorf("set collect_kernel: %w", err)
	}
	spec.Maps["target_pids"].MaxEntries = uint32(max(len(cfg.PIDs), 1))
	ringSize := cfg.RingBufferBytes
	if ringSize == 0 {
		ringSize = ringBufferSize(cfg.Frequency, len(cpus))
	}
	spec.Maps["events"].MaxEntries = uint32(ringSize)

	s := &Sampler{}
	if cfg.CollectStats {
		if s.stats, err = ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err != nil {
			return nil, classify("enable bpf stats", err)
		}
	}
	if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
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
	s.monoStart, s.wallStart = monotonicNow(), time.Now()
	for _, cpu := range cpus {
		fd, err := openCPUClock(cpu, cfg.Frequency, s.objs.Sample.FD())
		if err != nil {
			s.Close()
			return nil, err
		}
		s.perfFDs = append(s.perfFDs, fd)
	}
	return s, nil
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
func (s *Sampler) Run(ctx context.Context, h Handler) error {
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
	for {
		err := s.ring.ReadInto(&rec)
		switch {
		case errors.Is(err, ringbuf.ErrFlushed) && ctx.Err() != nil:
			return nil
		case errors.Is(err, ringbuf.ErrFlushed):
			continue
		case err != nil:
			return fmt.Errorf("read ring buffer: %w", err)
		}
		s.dispatch(rec.RawSample, &sample, h)
	}
}

func (s *Sampler) dispatch(raw []byte, sample *Sample, h Handler) {
	if len(raw) < 4 {
		return
	}
	switch samplerEventKind(*(*uint32)(unsafe.Pointer(&raw[0]))) {
	case samplerEventKindEVENT_SAMPLE:
		if len(raw) < int(unsafe.Sizeof(samplerSampleEvent{})) {
			return
		}
		e := (*samplerSampleEvent)(unsafe.Pointer(&raw[0]))
		*sample = Sample{
			PID:  e.Pid,
			TID:  e.Tid,
			CPU:  e.Cpu,
			Comm: commString(&e.Comm),
			Time: s.wallTime(e.KtimeNs),
		}
		sample.User, sample.UserErr = stackSlice(e.User[:], e.UserLen)
		sample.Kernel, sample.KernelErr = stackSlice(e.Kernel[:], e.KernelLen)
		h.HandleSample(sample)
	case samplerEventKindEVENT_EXEC, samplerEventKindEVENT_EXIT:
		if len(raw) < int(unsafe.Sizeof(samplerProcessEvent{})) {
			return
		}
		e := (*samplerProcessEvent)(unsafe.Pointer(&raw[0]))
		kind := ProcessExec
		if samplerEventKind(e.Kind) == samplerEventKindEVENT_EXIT {
			kind = ProcessExit
		}
		h.HandleProcessEvent(ProcessEvent{Kind: kind, PID: e.Pid, Time: s.wallTime(e.KtimeNs)})
	}
}

func (s *Sampler) wallTime(ktimeNs uint64) time.Time {
	return s.wallStart.Add(time.Duration(ktimeNs) - s.monoStart)
}

// stackSlice turns bpf_get_stack's result (bytes written, or -errno) into frames.
func stackSlice(frames []uint64, n int32) ([]uint64, error) {
	if n < 0 {
		return nil, unix.Errno(-n)
	}
	return frames[:min(int(n)/8, len(frames))], nil
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

// Counters sums the kernel-side counters over all CPUs.
func (s *Sampler) Counters() (Counters, error) {
	var out Counters
	fields := []*uint64{&out.Samples, &out.RingBufferFull, &out.UserStackErrors, &out.KernelStackErrors, &out.ProcessEvents}
	for i, field := range fields {
		var perCPU []uint64
		if err := s.objs.Counters.Lookup(uint32(i), &perCPU); err != nil {
			return out, fmt.Errorf("read counter %d: %w", i, err)
		}
		for _, v := range perCPU {
			*field += v
		}
	}
	return out, nil
}

// ProgramStats reports how often the sampling program ran and for how long in total.
func (s *Sampler) ProgramStats() (ProgramStats, error) {
	st, err := s.objs.Sample.Stats()
	if err != nil {
		return ProgramStats{}, fmt.Errorf("read sampler program stats: %w", err)
	}
	return ProgramStats{Runs: st.RunCount, Runtime: st.Runtime}, nil
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
