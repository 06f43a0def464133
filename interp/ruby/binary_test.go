package ruby

import (
	"debug/elf"
	"path/filepath"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/tracectx"
)

// TestInspect inspects Debian 12's libruby 3.1, which exports rb_vm_exec and
// ruby_current_ec, and Debian sid's 3.3, which hides both: each is found with its version,
// vm_exec_core (the function its frames are replaced at) and where each thread's
// execution context is.
func TestInspect(t *testing.T) {
	libs := map[string]string{}
	for _, r := range []testenv.Ruby{testenv.HostRuby(t), testenv.DebianRuby(t), testenv.DebianRuby34(t)} {
		matches, _ := filepath.Glob(filepath.Join(r.Root, "/usr/lib/x86_64-linux-gnu/libruby-"+r.Version[:3]+".so.*.*.*"))
		if len(matches) == 0 {
			t.Fatalf("no libruby of %s", r.Name)
		}
		libs[matches[0]] = r.Version
	}
	// A ruby linking the VM, built with YJIT, into its executable: its context is in the
	// executable's static TLS block.
	yjit := testenv.YJITRuby(t)
	libs[yjit.Path] = yjit.Version
	for path, version := range libs {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			v, err := Inspect(f)
			if err != nil {
				t.Fatal(err)
			}
			if v.Version.String() != version {
				t.Errorf("version %s, the program says %s", v.Version, version)
			}
			if v.Loop[1]-v.Loop[0] < minLoop || v.Exec[1] <= v.Exec[0] || v.Exec[0] < v.Loop[1] && v.Loop[0] < v.Exec[1] {
				t.Errorf("vm_exec at %#x, vm_exec_core at %#x", v.Exec, v.Loop)
			}
			if v.EC == nil || (v.EC.Access != tracectx.GlobalDynamic && v.EC.Access != tracectx.TLSDesc && v.EC.Access != tracectx.InitialExec && v.EC.Access != tracectx.LocalExec) {
				t.Errorf("ruby_current_ec reached by %+v", v.EC)
			}
			// ruby_global_symbols, found from rb_id2str's code: C methods are named by it.
			if want := path == yjit.Path; v.YJIT != want {
				t.Errorf("YJIT %v, want %v", v.YJIT, want)
			}
			if v.Symbols == 0 || v.LastOpID < 0xa0 || v.LastOpID > 0xc0 { // tLAST_OP_ID: 0xa9 in 3.1-3.3, 0xaa in 3.4
				t.Errorf("global symbols at %#x, last operator ID %#x", v.Symbols, v.LastOpID)
			}
			t.Logf("ruby %s: vm_exec %#x, vm_exec_core %#x, cold %#x, ruby_current_ec %+v, symbols %#x", v.Version, v.Exec, v.Loop, v.LoopCold, *v.EC, v.Symbols)
		})
	}
}

// TestVersion reads ruby_version's bytes.
func TestVersion(t *testing.T) {
	for in, want := range map[string]Version{"3.1.2\x00": {3, 1, 2}, "3.3.10": {3, 3, 10}} {
		if v, err := parseVersion([]byte(in)); err != nil || v != want {
			t.Errorf("%q: %v %v, want %v", in, v, err, want)
		}
	}
	if _, err := parseVersion([]byte("x")); err == nil {
		t.Error("a version read from nonsense")
	}
	if _, err := tableLayout(Version{2, 7, 8}); err == nil {
		t.Error("2.7 given a layout")
	}
}

// TestSuccinctLines decodes lines through a succinct bitvector as CRuby builds one: entries
// starting at positions 0, 3, 60 and 600 of a 700-word sequence.
func TestSuccinctLines(t *testing.T) {
	starts := []uint32{0, 3, 60, 600}
	const size = 700
	blocks := (size - succImmediate + succBlockBits - 1) / succBlockBits
	table := make([]byte, succImmWords*8+blocks*succBlockSize)
	rank := func(x uint32) int { // entries starting at or before x
		n := 0
		for _, s := range starts {
			if s <= x {
				n++
			}
		}
		return n
	}
	for x := uint32(0); x < succImmediate; x++ {
		w := table[(x/9)*8:]
		v := uint64(rank(x)) << ((x % 9) * 7)
		for i := range 8 {
			w[i] |= byte(v >> (8 * i))
		}
	}
	for b := 0; b < blocks; b++ {
		block := table[succImmWords*8+b*succBlockSize:]
		base := uint32(succImmediate + b*succBlockBits)
		r := rank(base - 1)
		block[0], block[1] = byte(r), byte(r>>8)
		var small uint64
		count := 0
		for word := 0; word < succBlockBits/64; word++ {
			if word > 0 {
				small |= uint64(count) << ((word - 1) * 9)
			}
			var bitsw uint64
			for bit := 0; bit < 64; bit++ {
				x := base + uint32(word*64+bit)
				for _, s := range starts {
					if s == x {
						bitsw |= 1 << bit
						count++
					}
				}
			}
			for i := range 8 {
				block[16+word*8+i] = byte(bitsw >> (8 * i))
			}
		}
		for i := range 8 {
			block[8+i] = byte(small >> (8 * i))
		}
	}
	lt := lineTable{lines: []int32{10, 11, 12, 13}, succ: table}
	// The kernel's position is the pc's, which points past the running instruction.
	for pos, want := range map[uint32]int{1: 10, 3: 10, 4: 11, 60: 11, 61: 12, 600: 12, 601: 13, 699: 13} {
		if got := lt.line(pos); got != want {
			t.Errorf("pc at %d: line %d, want %d", pos, got, want)
		}
	}
	pt := lineTable{lines: []int32{10, 11, 12, 13}, positions: starts}
	for pos, want := range map[uint32]int{1: 10, 4: 11, 61: 12, 601: 13} {
		if got := pt.line(pos); got != want {
			t.Errorf("positions: pc at %d: line %d, want %d", pos, got, want)
		}
	}
}
