package bpf

import (
	"testing"
	"unsafe"
)

// endRecord is the ring's bytes of an end record.
func endRecord(kind samplerEventKind, pid, tid uint32, start, weight uint64) []byte {
	e := samplerOffcpuEndEvent{Kind: uint32(kind), Pid: pid, Tid: tid, StartNs: start, EndNs: start + weight, WeightNs: weight}
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&e)), unsafe.Sizeof(e))...)
}

// A thread's wait pairs with its switch-out by thread and start; parked goroutines pair by
// the thread they parked on and their start, several on one thread at once; neither kind
// pairs with the other's; a process's exit drops both.
func TestOffCPUPendingPairs(t *testing.T) {
	var p offCPUPending
	user := []uint64{0x401000, 0x402000}
	p.hold(&Sample{PID: 1, TID: 11, User: user}, 100)
	p.holdGo(&Sample{PID: 1, TID: 11, User: []uint64{0x403000}}, 200)
	p.holdGo(&Sample{PID: 1, TID: 11, User: []uint64{0x404000}}, 300)
	user[0] = 0 // the ring's buffer is reused: what is held is a copy
	if p.size() != 3 {
		t.Fatalf("size %d", p.size())
	}
	if s, _ := p.end(endRecord(samplerEventKindEVENT_GOPARK_END, 1, 11, 100, 5)); s != nil {
		t.Errorf("a goroutine's end paired with a thread's switch-out: %+v", s)
	}
	if s, _ := p.end(endRecord(samplerEventKindEVENT_OFFCPU_END, 1, 11, 200, 5)); s != nil {
		t.Errorf("a thread's end paired with a goroutine's park: %+v", s)
	}
	s, w := p.end(endRecord(samplerEventKindEVENT_GOPARK_END, 1, 11, 300, 7))
	if s == nil || w != 7 || len(s.User) != 1 || s.User[0] != 0x404000 {
		t.Fatalf("second park: %+v, weight %d", s, w)
	}
	s, w = p.end(endRecord(samplerEventKindEVENT_OFFCPU_END, 1, 11, 100, 9))
	if s == nil || w != 9 || len(s.User) != 2 || s.User[0] != 0x401000 {
		t.Fatalf("thread's wait: %+v, weight %d", s, w)
	}
	if s, _ := p.end(endRecord(samplerEventKindEVENT_GOPARK_END, 2, 11, 200, 5)); s != nil {
		t.Errorf("another process's end paired: %+v", s)
	}
	if !p.forget(1) || p.size() != 0 || len(p.goPIDs) != 0 {
		t.Errorf("after the exit: %d held, %v", p.size(), p.goPIDs)
	}
	if p.forget(1) {
		t.Error("a process without parked goroutines said it had some")
	}
	for i := range maxGoPending + 10 {
		p.holdGo(&Sample{PID: 3, TID: 1}, uint64(i))
	}
	if len(p.goWaits) != maxGoPending || p.goPIDs[3] != maxGoPending {
		t.Errorf("%d parks held (%d counted), want the bound %d", len(p.goWaits), p.goPIDs[3], maxGoPending)
	}
}
