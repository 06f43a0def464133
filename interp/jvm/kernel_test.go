package jvm

import (
	"testing"

	"github.com/sonde-profiler/sonde/interp/interptest"
)

// TestKernelAgrees holds what the package writes and how it reads the kernel's frames to
// the kernel's (bpf/jvm.h), as the embedded program's BTF describes them: the per-process
// struct, the frame encoding and the walker's limits.
func TestKernelAgrees(t *testing.T) {
	interptest.CheckKernel(t, map[string]any{"jvm_proc": kernelProc{}}, map[string]map[string]uint64{
		"jvm_frame_encoding": {"JVM_RUNTIME": uint64(Number), "JVM_KIND_BIT": kindShift, "JVM_KIND_CODE": kindCode,
			"JVM_KIND_INTERPRETED": kindInterp, "JVM_RETURN_BIT": returnBit, "JVM_TAG_SHIFT": tagShift,
			"JVM_METHOD_SHIFT": methodShift, "JVM_BCI_BITS": bciBits, "JVM_BCI_UNKNOWN": BCIUnknown},
		"jvm_limits": {"JVM_MAX_HEAPS": kernelMaxHeaps, "JVM_SLOTS_BELOW": kernelSlotsBelow, "JVM_BLOB_READ": kernelBlobRead},
	})
}
