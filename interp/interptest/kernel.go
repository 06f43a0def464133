// Package interptest holds what the runtimes' tests share: a fake kernel.
package interptest

import (
	"sync"

	"github.com/sonde-profiler/sonde/interp"
)

// Kernel is an interp.Kernel that keeps what a runtime told it, for tests to look at.
type Kernel[S any] struct {
	mu      sync.Mutex
	States  map[uint32]*S              // the last state set of each process
	Regions map[uint32][]interp.Region // and its regions
	Deleted []uint32                   // processes deleted, in order
	Err     error                      // what Set returns, when set
	// Values answers Lookup: by map name, then by key.
	Values map[string]map[any]any
}

// NewKernel returns an empty Kernel for states of type S.
func NewKernel[S any]() *Kernel[S] {
	return &Kernel[S]{States: map[uint32]*S{}, Regions: map[uint32][]interp.Region{}, Values: map[string]map[any]any{}}
}

func (k *Kernel[S]) Set(pid uint32, execID uint64, state any, regions []interp.Region) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.Err != nil {
		return k.Err
	}
	s := *state.(*S)
	k.States[pid], k.Regions[pid] = &s, regions
	return nil
}

func (k *Kernel[S]) Delete(pid uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.Deleted = append(k.Deleted, pid)
	return nil
}

func (k *Kernel[S]) Lookup(name string, key, value any) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.Values[name][key]
	if !ok {
		return false, nil
	}
	if p, ok := value.(*uint64); ok {
		*p = v.(uint64)
	}
	return true, nil
}

func (k *Kernel[S]) Ends() (map[string]uint64, error) { return nil, nil }

// State returns the last state set of pid, or nil.
func (k *Kernel[S]) State(pid uint32) *S {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.States[pid]
}
