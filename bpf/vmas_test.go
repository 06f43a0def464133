package bpf

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A vma record goes with the sample its CPU sends next, at the same time, and with no other.
func TestVMARecordsPairWithTheirSample(t *testing.T) {
	var s Sampler
	rec := samplerVmaEvent{Kind: uint32(samplerEventKindEVENT_VMAS), Pid: 8, ExecId: 3, KtimeNs: 1000, Cpu: 1, Count: 1}
	rec.Hints[0] = samplerVmaHint{Start: 0x9000, End: 0xa000, Offset: 0x1000, Inode: 42, Dev: 259<<20 | 3}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&rec)), unsafe.Sizeof(rec))
	s.holdVMAs(raw)
	if v := s.takeVMAs(0, 1000); v != nil {
		t.Errorf("another CPU's sample took %v", v)
	}
	if v := s.takeVMAs(1, 999); v != nil {
		t.Errorf("an earlier sample of the CPU took %v", v)
	}
	v := s.takeVMAs(1, 1000)
	want := VMA{Start: 0x9000, End: 0xa000, Offset: 0x1000, Dev: unix.Mkdev(259, 3), Inode: 42}
	if len(v) != 1 || v[0] != want {
		t.Fatalf("the sample took %+v, want %+v", v, want)
	}
	if again := s.takeVMAs(1, 1000); again != nil {
		t.Errorf("taken twice: %v", again)
	}
	// A record cut short, or claiming more hints than it holds, names no more than it has.
	rec.Count = 200
	s.holdVMAs(raw[:vmaHeaderSize+4])
	if v := s.takeVMAs(1, 1000); v != nil {
		t.Errorf("a record too short for one hint gave %v", v)
	}
	s.holdVMAs(raw[:vmaHeaderSize-1])
	if v := s.takeVMAs(1, 1000); v != nil {
		t.Errorf("a record shorter than its header gave %v", v)
	}
}
