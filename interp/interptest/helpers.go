package interptest

import (
	"reflect"
	"syscall"
	"testing"

	"github.com/sonde-profiler/sonde/bpf"
	"github.com/sonde-profiler/sonde/internal/objfile"
)

// HostFile is a file of the host as the process tracker gives it to a runtime, identified.
func HostFile(t testing.TB, path string) *objfile.File {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	f := objfile.HostFile(objfile.Key{Dev: st.Dev, Inode: st.Ino}, path)
	if err := objfile.Identify(f); err != nil {
		t.Fatal(err)
	}
	return f
}

// CheckKernel holds what a runtime's package says of the kernel's program to what the
// program's BTF says: each Go struct laid out as the kernel's struct of its name
// (bpf.CheckLayout), and each constant equal to the enum member of its name.
func CheckKernel(t testing.TB, structs map[string]any, enums map[string]map[string]uint64) {
	t.Helper()
	for name, v := range structs {
		st, err := bpf.KernelStruct(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := bpf.CheckLayout(st, reflect.TypeOf(v)); err != nil {
			t.Error(err)
		}
	}
	for enum, members := range enums {
		kernel, err := bpf.KernelEnum(enum)
		if err != nil {
			t.Fatal(err)
		}
		for name, v := range members {
			if k, ok := kernel[name]; !ok || k != v {
				t.Errorf("%s: %d here, %d (%v) in the kernel", name, v, k, ok)
			}
		}
	}
}
