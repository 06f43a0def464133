package jvm

import (
	"reflect"
	"testing"

	"github.com/sonde-profiler/sonde/bpf"
)

// TestKernelAgrees holds what the package writes and how it reads the kernel's frames to
// the kernel's (bpf/jvm.h), as the embedded program's BTF describes them: the per-process
// struct, the frame encoding and the walker's limits.
func TestKernelAgrees(t *testing.T) {
	st, err := bpf.KernelStruct("jvm_proc")
	if err != nil {
		t.Fatal(err)
	}
	if err := bpf.CheckLayout(st, reflect.TypeOf(kernelProc{})); err != nil {
		t.Error(err)
	}
	want := map[string]map[string]uint64{
		"jvm_frame_encoding": {"JVM_RUNTIME": uint64(Number), "JVM_KIND_BIT": kindShift, "JVM_KIND_CODE": kindCode,
			"JVM_KIND_INTERPRETED": kindInterp, "JVM_RETURN_BIT": returnBit, "JVM_TAG_SHIFT": tagShift,
			"JVM_METHOD_SHIFT": methodShift, "JVM_BCI_BITS": bciBits, "JVM_BCI_UNKNOWN": BCIUnknown},
		"jvm_limits": {"JVM_MAX_HEAPS": kernelMaxHeaps, "JVM_SLOTS_BELOW": kernelSlotsBelow, "JVM_BLOB_READ": kernelBlobRead},
	}
	for enum, members := range want {
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
