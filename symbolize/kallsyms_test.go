package symbolize

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/sonde-profiler/sonde/trace"
)

// testKallsyms is out of order, as /proc/kallsyms is once modules are listed, and has
// aliases, data symbols and a module.
const testKallsyms = `ffffffff81000000 T _stext
ffffffff81000000 T _text
ffffffff81000000 T startup_64
ffffffff81001000 t do_one_initcall
ffffffff81002000 W arch_cpu_idle
ffffffff81002100 T schedule
ffffffff81003000 T _etext
ffffffff82000000 D jiffies
ffffffff82000100 b some_bss
ffffffffc0a00000 t ext4_map_blocks	[ext4]
ffffffffc0a00400 T ext4_file_write_iter	[ext4]
ffffffffc0a00800 d ext4_data	[ext4]
ffffffffc0900000 t bpf_prog_6deef7357e7b4530_sd_fw_ingress	[bpf]
`

func TestParseKallsyms(t *testing.T) {
	ks, err := ParseKallsyms(strings.NewReader(testKallsyms))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ks.Len(), 8; got != want {
		t.Errorf("Len() = %d, want %d", got, want)
	}
	for _, tc := range []struct {
		addr         uint64
		name, module string
	}{
		{0xffffffff80ffffff, "", ""},
		{0xffffffff81000000, "_text", ""}, // global, then shortest, then smallest
		{0xffffffff81000fff, "_text", ""},
		{0xffffffff81001234, "do_one_initcall", ""},
		{0xffffffff81002050, "arch_cpu_idle", ""},
		{0xffffffff81002fff, "schedule", ""},
		{0xffffffff81003000, "_etext", ""},
		{0xffffffff82000000, "", ""}, // data is not code: past _etext's bound
		{0xffffffffc0900010, "bpf_prog_6deef7357e7b4530_sd_fw_ingress", "bpf"},
		{0xffffffffc0910000, "", ""}, // past the last of a module: maybe a new one
		{0xffffffffc0a00010, "ext4_map_blocks", "ext4"},
		{0xffffffffc0a00900, "ext4_file_write_iter", "ext4"}, // module data is dropped
		{0xffffffffc0a00400 + maxTrailingExtent, "", ""},
	} {
		got, ok := ks.Lookup(tc.addr)
		if tc.name == "" {
			if ok {
				t.Errorf("Lookup(%#x) = %+v, want none", tc.addr, got)
			}
			continue
		}
		if !ok || got.Name != tc.name || got.Module != tc.module {
			t.Errorf("Lookup(%#x) = %+v, %v; want %s [%s]", tc.addr, got, ok, tc.name, tc.module)
		}
	}
}

func TestParseKallsymsHidden(t *testing.T) {
	hidden := `0000000000000000 T _stext
0000000000000000 t do_one_initcall
0000000000000000 t ext4_map_blocks	[ext4]
`
	if _, err := ParseKallsyms(strings.NewReader(hidden)); !errors.Is(err, ErrKernelAddressesHidden) {
		t.Fatalf("err = %v, want ErrKernelAddressesHidden", err)
	}
	path := filepath.Join(t.TempDir(), "kallsyms")
	if err := os.WriteFile(path, []byte(hidden), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKallsyms(path); !errors.Is(err, ErrKernelAddressesHidden) {
		t.Fatalf("LoadKallsyms: err = %v, want ErrKernelAddressesHidden", err)
	}
}

func TestParseKallsymsBad(t *testing.T) {
	for _, in := range []string{
		"",
		"ffffffff82000000 D jiffies\n",
		"ffffffff81000000T _stext\n",
		"zzzz T _stext\n",
		"ffffffff81000000 T \n",
	} {
		if _, err := ParseKallsyms(strings.NewReader(in)); err == nil {
			t.Errorf("ParseKallsyms(%q) succeeded", in)
		}
	}
	if _, err := LoadKallsyms(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("LoadKallsyms of a missing file succeeded")
	}
}

// FuzzParseKallsyms checks the compact table against a plain reading of the same
// text: every text symbol's address yields the alias the ordering prefers, and its
// module.
func FuzzParseKallsyms(f *testing.F) {
	f.Add(testKallsyms)
	f.Add("ffffffff81000000 T a\nffffffff81000000 t b\nffffffff81000010 w cc\t[m]\n")
	f.Add(strings.Repeat("ffffffff81000000 t x\n", 200) + "ffffffffc0000000 T y\t[z]\n")
	f.Fuzz(func(t *testing.T, in string) {
		ks, err := ParseKallsyms(strings.NewReader(in))
		if err != nil {
			return
		}
		type want struct {
			name, module string
			rank         int
		}
		model := map[uint64]want{}
		for line := range strings.Lines(in) {
			line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r") // as bufio.ScanLines reads it
			a, rest, _ := strings.Cut(line, " ")
			if len(rest) < 3 {
				continue
			}
			rank := strings.IndexByte("TWwt", rest[0])
			if rank < 0 {
				continue
			}
			rank = []int{0, 1, 1, 2}[rank]
			addr, err := strconv.ParseUint(a, 16, 64)
			if err != nil {
				t.Fatalf("parsed, though %q is no address", a)
			}
			name, mod, _ := strings.Cut(rest[2:], "\t")
			mod = strings.TrimSuffix(strings.TrimPrefix(mod, "["), "]")
			w, seen := model[addr]
			if !seen || preferAlias(rank, w.rank, name, w.name) < 0 {
				model[addr] = want{name, mod, rank}
			}
		}
		if ks.Len() != len(model) {
			t.Fatalf("%d symbols, want %d", ks.Len(), len(model))
		}
		for i := 1; i < ks.Len(); i++ {
			if ks.addr(i) <= ks.addr(i-1) {
				t.Fatalf("addresses out of order at %d", i)
			}
		}
		for addr, w := range model {
			if addr == math.MaxUint64 {
				continue // ranges are half-open: the address space's last byte is no symbol's
			}
			got, ok := ks.Lookup(addr)
			if !ok || got.Addr != addr || got.Name != w.name || got.Module != w.module {
				t.Fatalf("Lookup(%#x) = %+v, %v; want %s [%s]", addr, got, ok, w.name, w.module)
			}
		}
	})
}

// The table is a fraction of the names it holds, and names every symbol of this
// machine's kernel as a plain reading does.
func TestKallsymsCompact(t *testing.T) {
	data, err := os.ReadFile(DefaultKallsymsPath)
	if err != nil {
		t.Skipf("kallsyms: %v", err)
	}
	ks, err := ParseKallsyms(bytes.NewReader(data))
	if errors.Is(err, ErrKernelAddressesHidden) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	names, checked := 0, 0
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.ContainsAny(f[1], "TtWw") {
			continue
		}
		names += len(f[2])
		addr, _ := strconv.ParseUint(f[0], 16, 64)
		if got, ok := ks.Lookup(addr); !ok || got.Addr != addr {
			t.Fatalf("Lookup(%s) = %+v, %v", f[0], got, ok)
		}
		checked++
	}
	t.Logf("%d symbols, %d bytes of names, table %d bytes", ks.Len(), names, ks.SizeBytes())
	if ks.SizeBytes() > int64(names)*2/3 {
		t.Errorf("the table takes %d bytes for %d bytes of names", ks.SizeBytes(), names)
	}
}

// PrepareKernel reads kallsyms before the first pass, which then names kernel frames
// without reading it; a failure is returned there once, not again by the pass.
func TestPrepareKernel(t *testing.T) {
	path := writeKallsyms(t, testKallsyms)
	s := New(Options{KallsymsPath: path})
	if err := s.PrepareKernel(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := s.PrepareKernel(); err != nil {
		t.Fatalf("a second call read again: %v", err)
	}
	loc := &trace.Location{Kind: trace.FrameKernel, Address: 0xffffffff81002100}
	if errs := s.Symbolize(&trace.Profile{Locations: []*trace.Location{loc}}); len(errs) != 0 {
		t.Fatal(errs)
	}
	if len(loc.Lines) != 1 || loc.Lines[0].Function != "schedule" {
		t.Errorf("kernel frame named %+v, want schedule from the symbols read before", loc.Lines)
	}
	if s.kernel.reads != 1 {
		t.Errorf("kallsyms read %d times, want once", s.kernel.reads)
	}

	missing := New(Options{KallsymsPath: path})
	if err := missing.PrepareKernel(); err == nil || !strings.Contains(err.Error(), "kernel symbols") {
		t.Fatalf("PrepareKernel of a missing file: %v", err)
	}
	loc = &trace.Location{Kind: trace.FrameKernel, Address: 0xffffffff81002100}
	if errs := missing.Symbolize(&trace.Profile{Locations: []*trace.Location{loc}}); len(errs) != 0 {
		t.Errorf("the pass returned %v again", errs)
	}
	if New(Options{Mode: ModeNone, KallsymsPath: path}).PrepareKernel() != nil {
		t.Error("a symbolizer that names nothing read kallsyms")
	}
}

// The table lies outside the Go heap, where it costs no collector headroom, and its
// memory goes when the table does.
func TestKallsymsOffHeap(t *testing.T) {
	var b strings.Builder
	for i := range 60000 {
		fmt.Fprintf(&b, "%016x T kernel_function_%d_%s\n", 0xffffffff81000000+uint64(i)*64, i, strings.Repeat("x", i%23))
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	input := b.String()
	before := heap()
	ks, err := ParseKallsyms(strings.NewReader(input))
	if err != nil {
		t.Fatal(err)
	}
	grew := int64(heap()) - int64(before)
	runtime.KeepAlive(input)
	t.Logf("table %d bytes, heap grew %d", ks.SizeBytes(), grew)
	if grew > ks.SizeBytes()/10 {
		t.Errorf("the heap grew %d bytes for a table of %d", grew, ks.SizeBytes())
	}
	if got, ok := ks.Lookup(0xffffffff81000000 + 777*64 + 5); !ok || got.Name != "kernel_function_777_"+strings.Repeat("x", 777%23) {
		t.Errorf("Lookup = %+v, %v", got, ok)
	}
	at := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(ks.names))))
	mapped := func() bool {
		maps, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(maps)) {
			var lo, hi uint64
			if _, err := fmt.Sscanf(line, "%x-%x", &lo, &hi); err == nil && lo <= at && at < hi {
				return true
			}
		}
		return false
	}
	if !mapped() {
		t.Fatal("the table's names are not in a mapping of their own")
	}
	ks = nil
	deadline := time.Now().Add(10 * time.Second)
	for mapped() {
		if time.Now().After(deadline) {
			t.Fatal("the table's memory stayed mapped after the table went")
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
}
