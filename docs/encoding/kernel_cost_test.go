package encoding

import (
	"fmt"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// TestKernelLRUCost measures what the kernel-side proposal would add to the BPF
// program per chunk: hashing eight frames and looking the hash up in an LRU_HASH map,
// inserting it on a miss. It runs a program of 16 such chunks through BPF_PROG_RUN
// and subtracts an empty program's run. Needs root; prints with the tables:
//
//	go test -run '^TestKernelLRUCost$' -v ./docs/encoding -args -table
func TestKernelLRUCost(t *testing.T) {
	if !*table {
		t.Skip("measures BPF map costs; run with -args -table")
	}
	const chunks = 16
	fmt.Fprintf(os.Stdout, "\n#### Kernel side: cost of the LRU map, per chunk\n\n")
	fmt.Fprintln(os.Stdout, "|LRU entries|hit: hash + lookup|miss: hash + lookup + insert|")
	fmt.Fprintln(os.Stdout, "|---|---|---|")
	for _, entries := range []uint32{1024, 4096} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: 8, ValueSize: 8, MaxEntries: entries})
		if err != nil {
			t.Skipf("no BPF here: %v", err)
		}
		defer m.Close()
		base, err := runLRUProg(m, 0, false)
		if err != nil {
			t.Skipf("no BPF_PROG_RUN here: %v", err)
		}
		hit, err := runLRUProg(m, chunks, false)
		if err != nil {
			t.Fatal(err)
		}
		miss, err := runLRUProg(m, chunks, true)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(os.Stdout, "|%s|%.0f ns|%.0f ns|\n", num(int(entries)),
			float64(hit-base)/chunks, float64(miss-base)/chunks)
	}
}

// runLRUProg returns the mean run time in ns of a socket filter that handles n chunks:
// the same n keys every run (all hits after the first) or random ones (all misses).
func runLRUProg(m *ebpf.Map, n int, random bool) (int64, error) {
	insns := asm.Instructions{
		// The value inserted on a miss.
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreMem(asm.RFP, -16, asm.R1, asm.DWord),
	}
	for i := 0; i < n; i++ {
		hit := fmt.Sprintf("hit%d", i)
		if random {
			insns = append(insns, asm.FnGetPrandomU32.Call())
		} else {
			insns = append(insns, asm.Mov.Imm(asm.R0, int32(i)))
		}
		// Fold eight frames into the hash, as the program would a chunk's addresses.
		for f := 0; f < 8; f++ {
			insns = append(insns,
				asm.Xor.Imm(asm.R0, int32(0x5bd1e995+f)),
				asm.Mul.Imm(asm.R0, 0x2545f491),
			)
		}
		insns = append(insns,
			asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -8),
			asm.FnMapLookupElem.Call(),
			asm.JNE.Imm(asm.R0, 0, hit),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -8),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -16),
			asm.Mov.Imm(asm.R4, 0),
			asm.FnMapUpdateElem.Call(),
			asm.Mov.Imm(asm.R0, 0).WithSymbol(hit),
		)
	}
	insns = append(insns, asm.Mov.Imm(asm.R0, 0), asm.Return())
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL", Instructions: insns})
	if err != nil {
		return 0, fmt.Errorf("load lru program: %w", err)
	}
	defer prog.Close()
	// A run of 100000 repeats; the kernel reports the mean.
	_, d, err := prog.Benchmark(make([]byte, 64), 100000, nil)
	if err != nil {
		return 0, fmt.Errorf("run lru program: %w", err)
	}
	return d.Nanoseconds(), nil
}
