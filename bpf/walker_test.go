//go:build amd64

package bpf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/unwind"
	"github.com/sonde-profiler/sonde/unwind/walkmodel"
)

// The kernel's walker (unwinder.h) and package unwind's Go model of it are held together
// by running both on the same inputs: testdata/walker.c compiles unwinder.h natively with
// stand-ins for the BPF helpers, and every case below goes through it and through
// walkmodel.Walk. Frames and the way the walk ended must agree exactly.

// walkCase is one walk: the registers it starts from and everything the walker reads.
type walkCase struct {
	name   string
	thread walkmodel.Thread
	noProc bool // the process has no mappings in the kernel: frame pointers throughout
	// again: a later sample of the previous case's process, its mappings (maps) the same
	// writing of them, so that what the memo of rows found then still holds.
	again  bool
	maps   []unwind.KernelMapping
	tables map[uint32][]unwind.KernelRow
	goRT   map[uint32]*unwind.KernelGoRuntime
	mem    []memRegion
	// guess: where a synthetic case's leaf, in no function of its file's table, returns
	// to if the walker takes it for a leaf that pushed nothing; 0 for other cases.
	guess uint64
}

// memRegion is readable memory; reads elsewhere fail, as bpf_probe_read_user's do.
type memRegion struct {
	addr uint64
	b    []byte
}

// read returns the word at addr from the first region holding all eight bytes: the
// harness's rule.
func (c *walkCase) read(addr uint64) (uint64, bool) {
	for _, r := range c.mem {
		if addr >= r.addr && addr-r.addr <= uint64(len(r.b)) && uint64(len(r.b))-(addr-r.addr) >= 8 {
			return binary.LittleEndian.Uint64(r.b[addr-r.addr:]), true
		}
	}
	return 0, false
}

func (c *walkCase) table(id uint32) []unwind.KernelRow {
	rows, ok := c.tables[id]
	if !ok {
		return nil
	}
	if rows == nil {
		return []unwind.KernelRow{}
	}
	return rows
}

// model walks the case with package unwind.
func (c *walkCase) model() walkResult {
	k := walkmodel.KernelView{Table: c.table, GoRuntime: func(id uint32) *unwind.KernelGoRuntime { return c.goRT[id] }}
	if !c.noProc {
		k.Mappings = c.maps
	}
	frames, end := walkmodel.Walk(c.thread, k, c.read)
	return walkResult{frames: frames, end: uint32(end)}
}

// ptregsOrder names the registers of the kernel's struct pt_regs in its order, and
// dwarfOrder the general-purpose registers by DWARF number: two independent spellings of
// what arch_x86.h's ptregs_offset encodes, so that the harness checks that table too.
var (
	ptregsOrder = []string{"r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi", "rdi",
		"orig_rax", "rip", "cs", "eflags", "rsp", "ss"}
	dwarfOrder = []string{"rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"}
)

// ptregs lays a thread's registers out as struct pt_regs, user mode.
func ptregs(t walkmodel.Thread) []uint64 {
	byName := map[string]uint64{"rip": t.PC, "cs": 0x33, "ss": 0x2b}
	for i, name := range dwarfOrder {
		byName[name] = t.GPR[i]
	}
	out := make([]uint64, len(ptregsOrder))
	for i, name := range ptregsOrder {
		out[i] = byName[name]
	}
	return out
}

type walkResult struct {
	frames []uint64
	end    uint32
	// searches counts the tables the native walker searched: frames its memo of rows
	// did not have. The model has no memo and leaves it 0.
	searches int
}

func (r walkResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "end %s, %d frames:", UnwindEnd(r.end), len(r.frames))
	for _, f := range r.frames {
		fmt.Fprintf(&b, " %#x", f)
	}
	return b.String()
}

func (c *walkCase) encode(w *bufio.Writer) {
	fmt.Fprintf(w, "# %s\nregs %#x %#x %#x\ntls %#x\nptregs", c.name, c.thread.PC, c.thread.GPR[7], c.thread.GPR[6], c.thread.TLS)
	for _, v := range ptregs(c.thread) {
		fmt.Fprintf(w, " %#x", v)
	}
	w.WriteString("\n")
	if c.noProc {
		w.WriteString("noproc\n")
	}
	if c.again {
		w.WriteString("again\n")
	}
	for _, m := range c.maps {
		fmt.Fprintf(w, "map %#x %#x %#x %d %d\n", m.Start, m.End, m.Bias, m.TableId, m.RowsCount)
	}
	ids := make([]uint32, 0, len(c.tables))
	for id := range c.tables {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		// The table as the kernel holds it: rows, then their index.
		rows := unsafe.Slice((*UnwindRow)(unsafe.Pointer(unsafe.SliceData(c.tables[id]))), len(c.tables[id]))
		rows = append(slices.Clip(rows), rowIndex(rows)...)
		fmt.Fprintf(w, "table %d %d\n", id, len(rows))
		for _, r := range rows {
			fmt.Fprintf(w, "%#x %d %d %d %d %d %d %d\n", r.Pc, r.CfaOffset, r.FpOffset, r.CfaRule, r.FpRule, r.CfaReg, r.CfaIndex, r.CfaPost)
		}
	}
	for id, g := range c.goRT {
		fmt.Fprintf(w, "go %d %d %d %d %d %d %d %d %d %d %d %d\n", id, g.TlsG, g.G_m, g.G_sched, g.M_curg, g.G_status, g.GobufSp, g.GobufPc,
			g.GobufBp, g.G_stackHi, g.CgoDepth, g.CgoG)
	}
	for _, r := range c.mem {
		fmt.Fprintf(w, "mem %#x %s\n", r.addr, hex.EncodeToString(r.b))
	}
	w.WriteString("run\n")
}

var (
	walkerOnce sync.Once
	walkerBin  string
	walkerErr  error
)

// nativeWalker compiles testdata/walker.c once per test binary.
func nativeWalker(t *testing.T) string {
	t.Helper()
	gcc := testenv.RequireTool(t, "gcc")
	walkerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "walker")
		if err != nil {
			walkerErr = err
			return
		}
		walkerBin = filepath.Join(dir, "walker")
		// -Wno-attributes: arch_x86.h marks its kernel types for CO-RE, which gcc ignores.
		out, err := exec.Command(gcc, "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-attributes", "-Werror", "-D__TARGET_ARCH_x86",
			"-I.", "-o", walkerBin, "testdata/walker.c").CombinedOutput()
		if err != nil {
			walkerErr = fmt.Errorf("gcc testdata/walker.c: %v\n%s", err, out)
		}
	})
	if walkerErr != nil {
		t.Fatal(walkerErr)
	}
	return walkerBin
}

// runNative walks every case with the native build of unwinder.h, in one process.
func runNative(t *testing.T, cases []*walkCase) []walkResult {
	t.Helper()
	var in bytes.Buffer
	w := bufio.NewWriter(&in)
	for _, c := range cases {
		c.encode(w)
	}
	w.Flush()
	cmd := exec.Command(nativeWalker(t))
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("walker: %v\n%s", err, stderr.Bytes())
	}
	var res []walkResult
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || f[0] != "end" || f[2] != "searches" || f[4] != "frames" {
			t.Fatalf("walker printed %q", sc.Text())
		}
		end, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			t.Fatalf("walker printed %q", sc.Text())
		}
		searches, err := strconv.Atoi(f[3])
		if err != nil {
			t.Fatalf("walker printed %q", sc.Text())
		}
		r := walkResult{end: uint32(end), searches: searches}
		for _, x := range f[5:] {
			v, err := strconv.ParseUint(x, 0, 64)
			if err != nil {
				t.Fatalf("walker printed %q", sc.Text())
			}
			r.frames = append(r.frames, v)
		}
		res = append(res, r)
	}
	if len(res) != len(cases) {
		t.Fatalf("walker answered %d of %d cases", len(res), len(cases))
	}
	return res
}

// compareWalkers runs cases through both walkers and reports every disagreement. It
// returns the results, for tests that check what the walks covered.
func compareWalkers(t *testing.T, cases []*walkCase) []walkResult {
	t.Helper()
	native := runNative(t, cases)
	fails := 0
	for i, c := range cases {
		m := c.model()
		if m.end == native[i].end && slices.Equal(m.frames, native[i].frames) {
			continue
		}
		if fails++; fails > 10 {
			continue
		}
		var in bytes.Buffer
		w := bufio.NewWriter(&in)
		c.encode(w)
		w.Flush()
		if dir := os.Getenv("WALKER_DUMP"); dir != "" {
			// The whole input, to replay with: walker < file.
			os.WriteFile(filepath.Join(dir, fmt.Sprintf("case%d.txt", i)), in.Bytes(), 0o644)
		}
		t.Errorf("case %s:\n  kernel walker: %s\n  walkmodel.Walk:   %s\ninput:\n%s", c.name, native[i], m, truncate(in.String(), 4000))
	}
	if fails > 10 {
		t.Errorf("%d more cases disagree", fails-10)
	}
	return native
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
