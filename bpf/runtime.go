package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// RuntimeMaps names a language runtime's own maps in the kernel program (runtimes.h): what
// the loader sizes and a RuntimeKernel writes. The runtime's package under interp/ declares
// it; this package names no runtime.
type RuntimeMaps struct {
	// Number is the runtime's number in the frames and code regions the kernel writes.
	Number uint8
	// Procs is its per-process map, keyed by tgid and sized to Config.MaxProcesses: a
	// struct that begins with the __u64 exec_id it was written for.
	Procs string
	// Counters is its per-CPU array counting how its walks ended, indexed by the values
	// of its enum Ends, whose members (but the last, _MAX) name them.
	Counters, Ends string
	// Sizes sizes its other maps.
	Sizes map[string]uint32
}

// sizeRuntimes sizes each runtime's maps in spec for maxProcs processes.
func sizeRuntimes(spec *ebpf.CollectionSpec, runtimes []RuntimeMaps, maxProcs uint32) error {
	for _, rt := range runtimes {
		m := spec.Maps[rt.Procs]
		if m == nil {
			return fmt.Errorf("runtime %d: no map %s in the kernel program", rt.Number, rt.Procs)
		}
		m.MaxEntries = maxProcs
		for name, n := range rt.Sizes {
			m := spec.Maps[name]
			if m == nil {
				return fmt.Errorf("runtime %d: no map %s in the kernel program", rt.Number, name)
			}
			m.MaxEntries = n
		}
	}
	return nil
}

// RuntimeKernel writes and reads one language runtime's maps: its per-process state and
// its code regions, and its counters. It is safe for concurrent use.
type RuntimeKernel struct {
	s        *Sampler
	rt       RuntimeMaps
	procs    *ebpf.Map
	counters *ebpf.Map
	ends     map[uint64]string // the names of the ends the counters count
	state    reflect.Type      // what Set writes, checked against the kernel's struct
}

// Runtime returns the writer of a runtime's maps, for per-process state of state's type: a
// struct laid out as the kernel's value of rt.Procs, field for field (names compared
// without case and underscores, offsets and sizes exactly, no padding of Go's own), which
// it checks here, so that a runtime never writes a state the walker would misread.
func (s *Sampler) Runtime(rt RuntimeMaps, state any) (*RuntimeKernel, error) {
	k := &RuntimeKernel{s: s, rt: rt, procs: s.maps[rt.Procs], counters: s.maps[rt.Counters], state: reflect.TypeOf(state)}
	if k.procs == nil || (rt.Counters != "" && k.counters == nil) {
		return nil, fmt.Errorf("runtime %d: maps %s, %s: not in the kernel program", rt.Number, rt.Procs, rt.Counters)
	}
	if k.state.Kind() == reflect.Pointer {
		k.state = k.state.Elem()
	}
	if s.spec == nil {
		return nil, fmt.Errorf("runtime %d: %w", rt.Number, ErrRuntimesSealed)
	}
	ms := s.spec.Maps[rt.Procs]
	if err := CheckLayout(ms.Value, k.state); err != nil {
		return nil, fmt.Errorf("runtime %d: %s's value: %w", rt.Number, rt.Procs, err)
	}
	if rt.Ends != "" {
		var e *btf.Enum
		if err := s.spec.Types.TypeByName(rt.Ends, &e); err != nil {
			return nil, fmt.Errorf("runtime %d: enum %s: %w", rt.Number, rt.Ends, err)
		}
		k.ends = endNames(e)
	}
	return k, nil
}

// ErrRuntimesSealed is Runtime's error after SealRuntimes.
var ErrRuntimesSealed = errors.New("runtimes are registered before SealRuntimes")

// SealRuntimes lets go of the kernel program's maps' and types' BTF, which only Runtime
// reads: about 0.4 MB of heap that would otherwise stay, and with GOGC=50 another
// 0.2 MB of the collector's room above it. Runtime fails after it.
func (s *Sampler) SealRuntimes() {
	s.spec = nil
}

// endNames names an enum's values by its members, lower case, without their common prefix
// and without the _MAX member that counts them (PY_NO_THREAD: no_thread).
func endNames(e *btf.Enum) map[uint64]string {
	var names []string
	for _, v := range e.Values {
		if !strings.HasSuffix(v.Name, "_MAX") {
			names = append(names, v.Name)
		}
	}
	prefix := ""
	if len(names) > 0 {
		prefix = names[0][:strings.IndexByte(names[0], '_')+1]
		for _, n := range names {
			if !strings.HasPrefix(n, prefix) {
				prefix = ""
			}
		}
	}
	out := make(map[uint64]string, len(names))
	for _, v := range e.Values {
		if !strings.HasSuffix(v.Name, "_MAX") {
			out[v.Value] = strings.ToLower(strings.TrimPrefix(v.Name, prefix))
		}
	}
	return out
}

// Set tells the kernel pid runs the runtime, as of its exec execID: state (a pointer to the
// type Runtime was given) in the runtime's map, and regions, the runtime's code regions in
// the process whose native frames hand a sample to its walker after the walk (none for a
// runtime walked within the native walk).
func (k *RuntimeKernel) Set(pid uint32, execID uint64, state any, regions []Region) error {
	if t := reflect.TypeOf(state); t == nil || t.Kind() != reflect.Pointer || t.Elem() != k.state {
		return fmt.Errorf("set state of pid %d: a %v, want a *%v", pid, reflect.TypeOf(state), k.state)
	}
	if err := k.procs.Put(pid, state); err != nil {
		return fmt.Errorf("set %s of pid %d: %w", k.rt.Procs, pid, err)
	}
	if len(regions) > 0 {
		if err := k.s.setRegions(pid, execID, k.rt.Number, regions); err != nil {
			k.procs.Delete(pid)
			return fmt.Errorf("set %s of pid %d: %w", k.rt.Procs, pid, err)
		}
	}
	return nil
}

// Delete forgets what the kernel was told of pid's runtime.
func (k *RuntimeKernel) Delete(pid uint32) error {
	buf := make([]byte, k.procs.ValueSize())
	if err := k.procs.Lookup(pid, buf); err == nil && len(buf) >= 8 {
		if err := k.s.setRegions(pid, binary.NativeEndian.Uint64(buf), k.rt.Number, nil); err != nil {
			return fmt.Errorf("delete %s of pid %d: %w", k.rt.Procs, pid, err)
		}
	}
	if err := k.procs.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete %s of pid %d: %w", k.rt.Procs, pid, err)
	}
	return nil
}

// Lookup reads the value at key of one of the runtime's maps; false if it has none.
func (k *RuntimeKernel) Lookup(name string, key, value any) (bool, error) {
	m := k.s.maps[name]
	if m == nil {
		return false, fmt.Errorf("no map %s in the kernel program", name)
	}
	if err := m.Lookup(key, value); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("look up %s: %w", name, err)
	}
	return true, nil
}

// Ends counts the runtime's walks by how they ended, summed over CPUs, by the names of its
// ends (RuntimeMaps.Ends).
func (k *RuntimeKernel) Ends() (map[string]uint64, error) {
	if k.counters == nil {
		return nil, nil
	}
	out := make(map[string]uint64, len(k.ends))
	for i := range k.counters.MaxEntries() {
		v, err := perCPUSum(k.counters, i)
		if err != nil {
			return nil, fmt.Errorf("read %s[%d]: %w", k.rt.Counters, i, err)
		}
		name, ok := k.ends[uint64(i)]
		if !ok {
			name = "unknown"
		}
		out[name] += v
	}
	return out, nil
}

// KernelEnum returns the values of an enum of the kernel program, by name, from its BTF:
// for the packages that mirror them (and their tests), without the kernel.
func KernelEnum(name string) (map[string]uint64, error) {
	spec, err := loadSampler()
	if err != nil {
		return nil, err
	}
	var e *btf.Enum
	if err := spec.Types.TypeByName(name, &e); err != nil {
		return nil, fmt.Errorf("enum %s: %w", name, err)
	}
	out := make(map[string]uint64, len(e.Values))
	for _, v := range e.Values {
		out[v.Name] = v.Value
	}
	return out, nil
}

// KernelStruct returns the BTF of a struct of the kernel program, by name.
func KernelStruct(name string) (*btf.Struct, error) {
	spec, err := loadSampler()
	if err != nil {
		return nil, err
	}
	var s *btf.Struct
	if err := spec.Types.TypeByName(name, &s); err != nil {
		return nil, fmt.Errorf("struct %s: %w", name, err)
	}
	return s, nil
}

// CheckLayout tells whether Go type g is laid out as the kernel's type k: the same size,
// and for a struct each member of k at the offset and of the size of g's field of the same
// name (compared without case and underscores; the kernel's pad members may be Go's _ or
// Pad fields), nested structs and arrays alike, and no byte of g outside k's members.
func CheckLayout(k btf.Type, g reflect.Type) error {
	k = btf.UnderlyingType(k)
	size, err := btf.Sizeof(k)
	if err != nil {
		return err
	}
	if uintptr(size) != g.Size() {
		return fmt.Errorf("%v is %d bytes, the kernel's %v %d", g, g.Size(), k, size)
	}
	switch k := k.(type) {
	case *btf.Struct:
		if g.Kind() != reflect.Struct {
			return fmt.Errorf("%v is not a struct, the kernel's %s is", g, k.Name)
		}
		fields := map[string]reflect.StructField{}
		var covered uintptr
		for i := range g.NumField() {
			f := g.Field(i)
			if f.Type.Size() == 0 {
				continue // structs.HostLayout and the like
			}
			covered += f.Type.Size()
			fields[layoutName(f.Name)] = f
		}
		if covered != g.Size() {
			return fmt.Errorf("%v has %d bytes of padding of its own: the kernel's %s has them as members", g, g.Size()-covered, k.Name)
		}
		for _, m := range k.Members {
			f, ok := fields[layoutName(m.Name)]
			if !ok && strings.HasPrefix(m.Name, "pad") {
				continue // a Go field _ of the same bytes: the sizes above cover it
			}
			if !ok {
				return fmt.Errorf("%v has no field for the kernel's %s.%s", g, k.Name, m.Name)
			}
			if f.Offset != uintptr(m.Offset.Bytes()) {
				return fmt.Errorf("%v.%s at %d, the kernel's %s.%s at %d", g, f.Name, f.Offset, k.Name, m.Name, m.Offset.Bytes())
			}
			if err := CheckLayout(m.Type, f.Type); err != nil {
				return fmt.Errorf("%s.%s: %w", k.Name, m.Name, err)
			}
		}
	case *btf.Array:
		if g.Kind() != reflect.Array || uint32(g.Len()) != k.Nelems {
			return fmt.Errorf("%v is not an array of %d, the kernel's is", g, k.Nelems)
		}
		return CheckLayout(k.Type, g.Elem())
	case *btf.Int, *btf.Enum:
		if g.Kind() == reflect.Struct || g.Kind() == reflect.Array {
			return fmt.Errorf("%v is not a number, the kernel's %s is", g, k.TypeName())
		}
	}
	return nil
}

// layoutName is a field's or a member's name as CheckLayout compares them.
func layoutName(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }
