package bpf

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// TestCheckLayout: a Go struct laid out as the kernel's passes; one with two fields of the
// same size swapped, a field missing, padding of Go's own or an array of another length
// fails, saying where.
func TestCheckLayout(t *testing.T) {
	k, err := KernelStruct("interp_proc")
	if err != nil {
		t.Fatal(err)
	}
	type region struct {
		Start, End       uint64
		Runtime, Padding uint32
	}
	type good struct {
		ExecID   uint64
		Runtimes uint32
		Count    uint32
		Regions  [8]region
	}
	type swapped struct {
		ExecID   uint64
		Count    uint32
		Runtimes uint32
		Regions  [8]region
	}
	type short struct {
		ExecID   uint64
		Runtimes uint32
		Count    uint32
		Regions  [7]region
		_        [24]byte
	}
	type padded struct {
		ExecID   uint64
		Runtimes uint16
		Count    uint32
		Regions  [8]region
	}
	if err := CheckLayout(k, reflect.TypeOf(good{})); err != nil {
		t.Errorf("the kernel's layout: %v", err)
	}
	for want, g := range map[string]any{"Runtimes at 12": swapped{}, "is 168 bytes": short{}, "padding": padded{}} {
		err := CheckLayout(k, reflect.TypeOf(g))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%T: %v, want an error saying %q", g, err, want)
		}
	}
}

// TestEndNames: an enum's members name its values, lower case, without their common prefix
// and without the member that counts them.
func TestEndNames(t *testing.T) {
	e := &btf.Enum{Name: "x_end", Values: []btf.EnumValue{{Name: "X_COMPLETE", Value: 0}, {Name: "X_BAD_READ", Value: 1}, {Name: "X_END_MAX", Value: 2}}}
	got := endNames(e)
	if len(got) != 2 || got[0] != "complete" || got[1] != "bad_read" {
		t.Errorf("endNames = %v", got)
	}
}

// After SealRuntimes the program's BTF is gone: a runtime registered later is refused
// with a clear error rather than checked against nothing.
func TestSealRuntimes(t *testing.T) {
	testenv.RequireRoot(t)
	s, err := Load(Config{PIDs: []uint32{uint32(os.Getpid())}, Frequency: 19})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer s.Close()
	py := RuntimeMaps{Number: 1, Procs: "py_procs", Counters: "py_counters", Ends: "py_end"}
	k, err := s.Runtime(py, samplerPyProc{})
	if err != nil {
		t.Fatalf("before the seal: %v", err)
	}
	if len(k.ends) == 0 {
		t.Error("no names for py_end's values")
	}
	s.SealRuntimes()
	if s.spec != nil {
		t.Error("the spec is still held")
	}
	if _, err := s.Runtime(py, samplerPyProc{}); !errors.Is(err, ErrRuntimesSealed) {
		t.Errorf("after the seal: %v, want %v", err, ErrRuntimesSealed)
	}
}
