package interp

import "sync"

// Procs is a tracker's processes: the image of the runtime each runs (I), as the kernel
// was told of it, and the kernel's writes, counted where they fail. It is safe for
// concurrent use: the process tracker's goroutine updates it, the namer's reads it.
type Procs[I any] struct {
	kernel Kernel

	mu           sync.Mutex
	images       map[uint32]*I
	kernelErrors uint64
}

// NewProcs returns Procs writing to k.
func NewProcs[I any](k Kernel) *Procs[I] {
	return &Procs[I]{kernel: k, images: map[uint32]*I{}}
}

// Image returns the image of the runtime pid runs, or nil. An image is not changed once
// shared: Update puts a new one in its place.
func (p *Procs[I]) Image(pid uint32) *I {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.images[pid]
}

// Update gives next the image pid has (nil: none), under the lock, and puts the one it
// returns in its place; nil keeps the old one. It tells whether it put one.
func (p *Procs[I]) Update(pid uint32, next func(old *I) *I) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	img := next(p.images[pid])
	if img == nil {
		return false
	}
	p.images[pid] = img
	return true
}

// Tell writes pid's state to the kernel (Kernel.Set), counting a failure.
func (p *Procs[I]) Tell(pid uint32, execID uint64, state any, regions []Region) {
	if err := p.kernel.Set(pid, execID, state, regions); err != nil {
		p.mu.Lock()
		p.kernelErrors++
		p.mu.Unlock()
	}
}

// Forget forgets pid, and deletes what the kernel was told of it if it was.
func (p *Procs[I]) Forget(pid uint32) {
	p.mu.Lock()
	_, had := p.images[pid]
	delete(p.images, pid)
	p.mu.Unlock()
	if had {
		if err := p.kernel.Delete(pid); err != nil {
			p.mu.Lock()
			p.kernelErrors++
			p.mu.Unlock()
		}
	}
}

// Counts returns how many processes run the runtime now, and how many of the kernel's
// writes failed.
func (p *Procs[I]) Counts() (processes int, kernelErrors uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.images), p.kernelErrors
}
