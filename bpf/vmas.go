package bpf

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// VMA is an executable mapping a sampled frame lay in, as the kernel had it at the sample.
// The kernel names them for samples of an image user space has not read yet, so that a
// program gone before its /proc/PID/maps is read still has its frames resolved.
type VMA struct {
	Start, End uint64
	Offset     uint64 // the file offset Start maps
	// Dev (in the encoding stat uses) and Inode identify the file; Inode 0: no file.
	Dev, Inode uint64
}

// MaxVMAs bounds the mappings the kernel names for one sample.
const MaxVMAs = int(samplerVmaLimitsMAX_VMA_HINTS)

var vmaHeaderSize = int(unsafe.Offsetof(samplerVmaEvent{}.Hints))

// pendingVMAs is what a CPU's latest vma record named, until its sample comes.
type pendingVMAs struct {
	ktime uint64
	vmas  []VMA
}

// holdVMAs keeps a vma record for the sample its CPU sends next.
func (s *Sampler) holdVMAs(raw []byte) {
	if len(raw) < vmaHeaderSize {
		return
	}
	e := (*samplerVmaEvent)(unsafe.Pointer(&raw[0]))
	if e.Cpu >= maxContextCPUs {
		return
	}
	for int(e.Cpu) >= len(s.pendingVMAs) {
		s.pendingVMAs = append(s.pendingVMAs, pendingVMAs{})
	}
	n := min(int(e.Count), (len(raw)-vmaHeaderSize)/int(unsafe.Sizeof(samplerVmaHint{})), MaxVMAs)
	hints := unsafe.Slice((*samplerVmaHint)(unsafe.Pointer(&raw[vmaHeaderSize])), n)
	p := &s.pendingVMAs[e.Cpu]
	p.ktime, p.vmas = e.KtimeNs, p.vmas[:0]
	for _, h := range hints {
		v := VMA{Start: h.Start, End: h.End, Offset: h.Offset, Inode: h.Inode}
		if h.Inode != 0 {
			v.Dev = kernelDev(h.Dev)
		}
		p.vmas = append(p.vmas, v)
	}
}

// takeVMAs hands a sample the mappings its CPU named just before it, if they were its.
func (s *Sampler) takeVMAs(cpu uint32, ktime uint64) []VMA {
	if int(cpu) >= len(s.pendingVMAs) {
		return nil
	}
	p := &s.pendingVMAs[cpu]
	if p.ktime != ktime || len(p.vmas) == 0 {
		return nil
	}
	vmas := p.vmas
	p.vmas = p.vmas[:0:0]
	p.ktime = 0
	// The slice goes with the sample; the next record of the CPU gets a buffer of its own
	// only when it comes, which is rare: images not read yet.
	return vmas
}

// kernelDev turns the kernel's internal dev_t (major << 20 | minor) into stat's encoding.
func kernelDev(dev uint32) uint64 {
	return unix.Mkdev(dev>>20, dev&(1<<20-1))
}
