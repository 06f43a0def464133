package ruby

import (
	"testing"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
)

// TestYJITCode finds YJIT's code among a process's executable mappings: the anonymous ones
// near the VM, and the rest of a default reservation after them, short of the next
// executable mapping; none where the VM has no YJIT, or the anonymous code is far away.
func TestYJITCode(t *testing.T) {
	lib := &trace.Mapping{Start: 0x5555_0000_0000, End: 0x5555_0040_0000, Path: "/usr/lib/libruby.so", File: &objfile.File{}}
	jit := &trace.Mapping{Start: 0x5555_0050_0000, End: 0x5555_0050_3000}
	jit2 := &trace.Mapping{Start: 0x5555_0051_0000, End: 0x5555_0051_4000}
	far := &trace.Mapping{Start: 0x7f00_0000_0000, End: 0x7f00_0000_1000}
	next := &trace.Mapping{Start: 0x5555_0100_0000, End: 0x5555_0100_1000, Path: "/usr/lib/libother.so", File: &objfile.File{}}
	vdso := &trace.Mapping{Start: 0x7fff_0000_0000, End: 0x7fff_0000_2000, Path: "[vdso]"}
	yjit, plain := &VM{YJIT: true}, &VM{}
	for _, tc := range []struct {
		name     string
		vm       *VM
		mappings []*trace.Mapping
		want     [2]uint64
	}{
		{"reservation", yjit, []*trace.Mapping{lib, jit, jit2, far, vdso}, [2]uint64{jit.Start, jit.Start + yjitReserve}},
		{"short of the next mapping", yjit, []*trace.Mapping{lib, jit, jit2, next}, [2]uint64{jit.Start, next.Start}},
		{"no yjit in the vm", plain, []*trace.Mapping{lib, jit, jit2}, [2]uint64{}},
		{"anonymous code far away", yjit, []*trace.Mapping{lib, far, vdso}, [2]uint64{}},
	} {
		if got := yjitCode(tc.vm, lib, tc.mappings); got != tc.want {
			t.Errorf("%s: %#x, want %#x", tc.name, got, tc.want)
		}
	}
}
