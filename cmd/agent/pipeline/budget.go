package pipeline

import (
	"log/slog"
	"maps"
	"math/bits"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/internal/procfs"
)

// MinMemoryLimit is the least --memory-limit sonde can keep to: its code, one interval's
// working set and a few symbol files.
const MinMemoryLimit = 32 << 20

// budget divides --memory-limit among everything that grows with what the host runs, so
// that one number bounds sonde however busy or hostile the host is. About a quarter goes
// to kernel memory (BPF maps, which the kernel charges to sonde's cgroup but which do not
// show in its RSS), the rest to sonde's own memory, of which the Go heap gets most.
type budget struct {
	limit int64
	// Kernel memory.
	unwindRows   int // rows of unwind tables, 16 bytes each
	maxProcesses int // processes whose mappings the kernel unwinder and the tracker hold
	// sonde's own memory.
	rss        int64 // above this, sonde sheds caches and queued intervals
	goLimit    int64 // the Go runtime's soft limit
	ringBytes  int   // the BPF ring buffer, mapped into sonde
	chunkCache int   // stack chunks interned
	locations  int   // locations the interned chunks hold
	// The symbolizer's caches, in bytes as it estimates them: parsed files, decoded
	// DWARF units, named addresses.
	fileCacheBytes    int64
	dwarfCacheBytes   int64
	addressCacheBytes int64
	// decompressedBytes bounds the decompressed DWARF sections held at once: the
	// largest transient of a naming pass, outside the Go heap and its soft limit.
	decompressedBytes int64
	queueBytes        int // encoded intervals queued for the collector
	// runtimeBytes bounds, by runtime, what naming its frames keeps across processes (its
	// interp.Spec's MemoryBytes).
	runtimeBytes map[string]int
	mergedStacks int // distinct samples the run's merged --output profile keeps
}

// Estimated costs of one entry, from the structures' sizes: they turn byte shares into counts.
const (
	procInfoBytes  = int(unsafe.Sizeof(bpf.ExecMapping{}))*bpf.MaxProcessMappings + 64 // a hash entry of struct proc_info
	chunkBytes     = 400                                                               // a chunk of 8 frames with its locations
	locationBytes  = 300                                                               // a location with its name and file
	mergedBytes    = 300                                                               // a merged sample with its stack
	unwindRowBytes = 16                                                                // the kernel rounds a 12-byte row up
)

// newBudget divides limit. Flags that set one of the sizes explicitly win over it.
func newBudget(limit int64, cfg *Config, cpus int) budget {
	b := budget{limit: limit}
	share := func(percent int64) int64 { return limit * percent / 100 }
	b.unwindRows = int(share(20) / unwindRowBytes)
	b.maxProcesses = min(bpf.DefaultMaxProcesses, max(256, int(share(6))/procInfoBytes))
	b.rss = limit - share(26)
	b.goLimit = share(50)
	b.ringBytes = ringBytes(cfg.Frequency, cpus, share(4))
	b.chunkCache = max(1024, int(share(5))/chunkBytes)
	b.locations = max(4096, int(share(5))/locationBytes)
	// The symbolizer's defaults at the default limit, in proportion to it: what a busy
	// host's interval names fits them, and every file, unit and name can be read again.
	b.fileCacheBytes = max(1<<20, limit/32)
	b.dwarfCacheBytes = max(512<<10, limit/64)
	b.addressCacheBytes = max(512<<10, limit/64)
	b.decompressedBytes = max(4<<20, limit/8)
	b.queueBytes = int(share(10))
	b.runtimeBytes = map[string]int{}
	for _, s := range runtimeSpecs {
		if s.MemoryBytes != nil {
			b.runtimeBytes[s.Name] = s.MemoryBytes(limit)
		}
	}
	b.mergedStacks = max(1024, int(share(8))/mergedBytes)
	if cfg.UnwindRows > 0 {
		b.unwindRows = cfg.UnwindRows
	}
	if cfg.ChunkCache > 0 {
		b.chunkCache = cfg.ChunkCache
	}
	return b
}

// ringBytes sizes the ring buffer for about a second of samples at their largest, a
// power of two between 256 KiB and limit.
func ringBytes(frequency, cpus int, limit int64) int {
	const minSize = 256 << 10
	want := frequency * cpus * bpf.MaxSampleBytes
	size := 1 << bits.Len(uint(max(want, 1)-1))
	for size > minSize && int64(size) > limit {
		size >>= 1
	}
	return max(size, minSize)
}

func (b budget) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.Int64("limit_bytes", b.limit), slog.Int64("go_limit_bytes", b.goLimit), slog.Int("unwind_rows", b.unwindRows),
		slog.Int("processes", b.maxProcesses), slog.Int("ring_bytes", b.ringBytes), slog.Int("chunks", b.chunkCache), slog.Int("locations", b.locations),
		slog.Int64("file_cache_bytes", b.fileCacheBytes), slog.Int64("dwarf_cache_bytes", b.dwarfCacheBytes),
		slog.Int64("decompressed_dwarf_bytes", b.decompressedBytes),
		slog.Int64("address_cache_bytes", b.addressCacheBytes), slog.Int("queue_bytes", b.queueBytes)}
	for _, name := range slices.Sorted(maps.Keys(b.runtimeBytes)) {
		attrs = append(attrs, slog.Int(name+"_bytes", b.runtimeBytes[name]))
	}
	return slog.GroupValue(attrs...)
}

// pressure watches sonde's resident memory and, above the budget, sheds the least
// valuable state first: symbol caches (named again from the files when needed), then
// intervals queued for an absent collector. Sampling goes on whatever is shed.
type pressure struct {
	limit   int64
	sheds   []func() // least valuable first
	log     *slog.Logger
	shed    atomic.Uint64
	peakRSS atomic.Int64

	// Owned by check's caller.
	statm  residentReader
	next   int  // the shed to run next
	warned bool // since the resident set went over the budget
}

// check reads the resident set and, above the budget, sheds the next cache. The
// ring buffer's reader calls it about once a second, after a poll (pipeline.Polled):
// each wake-up of an otherwise idle agent costs Go's scheduler and its monitor thread
// more than the check itself, so it adds none of its own.
func (p *pressure) check() {
	rss := p.statm.bytes()
	if rss > p.peakRSS.Load() {
		p.peakRSS.Store(rss)
	}
	if rss <= p.limit {
		p.next, p.warned = 0, false
		return
	}
	if !p.warned {
		p.log.Warn("memory over budget: dropping caches, then queued intervals; sampling goes on", "rss_bytes", rss, "budget_bytes", p.limit)
		p.warned = true
	}
	if p.next < len(p.sheds) {
		p.sheds[p.next]()
		p.shed.Add(1)
		p.next++
		debug.FreeOSMemory()
	}
}

// residentReader reads the resident set size from /proc/self/statm kept open: a read at
// offset 0 produces the file afresh, one system call a check rather than four.
type residentReader struct {
	f   *os.File
	buf [128]byte
}

func (r *residentReader) bytes() int64 {
	if r.f == nil {
		f, err := os.Open("/proc/self/statm")
		if err != nil {
			return 0
		}
		r.f = f
	}
	n, err := r.f.ReadAt(r.buf[:], 0)
	if n == 0 && err != nil {
		return 0
	}
	return procfs.StatmResident(r.buf[:n])
}

func (r *residentReader) close() {
	if r.f != nil {
		r.f.Close()
	}
}

// residentBytes is the process's resident set size.
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	return procfs.StatmResident(b)
}

// highWaterBytes is the process's peak resident set size (VmHWM), 0 when unknown.
func highWaterBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			fields := strings.Fields(rest)
			if len(fields) == 2 && fields[1] == "kB" {
				kb, _ := strconv.ParseInt(fields[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
