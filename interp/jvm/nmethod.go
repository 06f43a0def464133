package jvm

import (
	"encoding/binary"
	"fmt"
	"sort"
)

// PcDesc maps an offset in an nmethod's code to the scope describing it.
type PcDesc struct {
	PcOffset    int32 // from the nmethod's code begin
	ScopeOffset int32 // in the scopes data; 0: none
}

// DebugInfo is what an nmethod says of its code's source: the PcDescs, the scopes data
// they point into, and the metadata (Method*s) the scopes index.
type DebugInfo struct {
	PcDescs  []PcDesc
	Scopes   []byte
	Metadata []uint64
}

// Size is the bytes a DebugInfo holds, for bounding caches.
func (d *DebugInfo) Size() int { return len(d.PcDescs)*8 + len(d.Scopes) + len(d.Metadata)*8 }

// Bounds on an nmethod's debug info.
const (
	maxPcDescsBytes = 4 << 20
	maxScopesBytes  = 8 << 20
	maxMetadata     = 1 << 16
)

// ReadDebugInfo reads an nmethod's PcDescs, scopes data and metadata, wherever this
// build keeps them (see Layout.NMethodImmutable).
func (p *Process) ReadDebugInfo(b *Blob) (*DebugInfo, error) {
	if !b.NMethod {
		return nil, fmt.Errorf("code blob %q at %#x is not an nmethod", b.Name, b.Addr)
	}
	l := p.Layout
	r := b.rec
	var pcs, pcsEnd, scopes, scopesEnd, meta, metaEnd uint64
	if l.NMethodImmutable {
		imm := r.u(l.NMethodImmutableData)
		immSize := uint64(r.i(l.NMethodImmutableDataSize))
		pcs = imm + uint64(r.i(l.NMethodScopesPcsOffset))
		pcsEnd = imm + uint64(r.i(l.NMethodScopesDataOffset))
		scopes, scopesEnd = pcsEnd, imm+immSize
		mut := r.u(l.BlobMutableData)
		meta = mut + uint64(r.i(l.BlobRelocationSize))
		metaEnd = mut + uint64(r.i(l.BlobMutableDataSize))
	} else {
		pcs = b.Addr + uint64(r.i(l.NMethodScopesPcsOffset))
		pcsEnd = b.Addr + uint64(r.i(l.NMethodDependenciesOffset))
		scopes, scopesEnd = r.u(l.NMethodScopesDataBegin), pcs
		meta, metaEnd = b.Addr+uint64(r.i(l.NMethodMetadataOffset)), scopes
		if scopes < b.Addr || pcsEnd > b.End {
			return nil, fmt.Errorf("nmethod at %#x: debug info [%#x, %#x) outside it", b.Addr, scopes, pcsEnd)
		}
	}
	if pcsEnd < pcs || pcsEnd-pcs > maxPcDescsBytes || (pcsEnd-pcs)%l.PcDescSize != 0 {
		return nil, fmt.Errorf("nmethod at %#x: PcDescs [%#x, %#x): implausible", b.Addr, pcs, pcsEnd)
	}
	if scopesEnd < scopes || scopesEnd-scopes > maxScopesBytes {
		return nil, fmt.Errorf("nmethod at %#x: scopes data [%#x, %#x): implausible", b.Addr, scopes, scopesEnd)
	}
	if metaEnd < meta || (metaEnd-meta)/8 > maxMetadata {
		return nil, fmt.Errorf("nmethod at %#x: metadata [%#x, %#x): implausible", b.Addr, meta, metaEnd)
	}
	d := &DebugInfo{}
	raw, err := p.read(pcs, pcsEnd-pcs)
	if err != nil {
		return nil, fmt.Errorf("read PcDescs of nmethod at %#x: %w", b.Addr, err)
	}
	for off := uint64(0); off < uint64(len(raw)); off += l.PcDescSize {
		e := record(raw[off : off+l.PcDescSize])
		d.PcDescs = append(d.PcDescs, PcDesc{PcOffset: int32(e.i(l.PcDescPcOffset)), ScopeOffset: int32(e.i(l.PcDescScope))})
	}
	if d.Scopes, err = p.read(scopes, scopesEnd-scopes); err != nil {
		return nil, fmt.Errorf("read scopes of nmethod at %#x: %w", b.Addr, err)
	}
	mraw, err := p.read(meta, (metaEnd-meta)&^7)
	if err != nil {
		return nil, fmt.Errorf("read metadata of nmethod at %#x: %w", b.Addr, err)
	}
	for i := 0; i < len(mraw); i += 8 {
		d.Metadata = append(d.Metadata, binary.LittleEndian.Uint64(mraw[i:]))
	}
	return d, nil
}

// PcDescAt finds the PcDesc of a code offset as HotSpot does for a pc that may not be
// a call's return address (PcDescContainer::find_pc_desc, approximate): the first whose
// offset is at or after it. A return address has its own.
func (d *DebugInfo) PcDescAt(off int32) (PcDesc, bool) {
	i := sort.Search(len(d.PcDescs), func(i int) bool { return d.PcDescs[i].PcOffset >= off })
	if i == len(d.PcDescs) {
		return PcDesc{}, false
	}
	return d.PcDescs[i], true
}

// PcDescBefore finds the last PcDesc with scopes before a code offset.
func (d *DebugInfo) PcDescBefore(off int32) (PcDesc, bool) {
	i := sort.Search(len(d.PcDescs), func(i int) bool { return d.PcDescs[i].PcOffset >= off })
	for i--; i >= 0; i-- {
		if d.PcDescs[i].ScopeOffset != 0 {
			return d.PcDescs[i], true
		}
	}
	return PcDesc{}, false
}

// PcDescExact finds the PcDesc recorded at exactly a code offset, as HotSpot finds a
// caller's (PcDescContainer::find_pc_desc, not approximate): a call's return address has
// one of its own, and the next one may describe other inlined code.
func (d *DebugInfo) PcDescExact(off int32) (PcDesc, bool) {
	i := sort.Search(len(d.PcDescs), func(i int) bool { return d.PcDescs[i].PcOffset >= off })
	if i == len(d.PcDescs) || d.PcDescs[i].PcOffset != off {
		return PcDesc{}, false
	}
	return d.PcDescs[i], true
}

// ScopesAt decodes the inlining chain at a code offset, innermost first, with each
// scope's Method*.
func (p *Process) ScopesAt(d *DebugInfo, off int32) ([]Scope, []uint64, error) {
	pd, ok := d.PcDescAt(off)
	if !ok {
		return nil, nil, fmt.Errorf("no PcDesc at or after code offset %d", off)
	}
	return p.scopesOf(d, pd)
}

// scopesOf decodes the inlining chain a PcDesc points to.
func (p *Process) scopesOf(d *DebugInfo, pd PcDesc) ([]Scope, []uint64, error) {
	scopes, err := DecodeScopes(d.Scopes, int(pd.ScopeOffset), p.x, int32(p.Layout.InvocationEntryBCI))
	if err != nil {
		return nil, nil, fmt.Errorf("decode scopes at %d: %w", pd.ScopeOffset, err)
	}
	methods := make([]uint64, len(scopes))
	for i, s := range scopes {
		// Index 0 stands for null; the metadata array starts at index 1.
		if s.MethodIndex == 0 || int(s.MethodIndex) > len(d.Metadata) {
			return nil, nil, fmt.Errorf("scope method index %d of %d metadata", s.MethodIndex, len(d.Metadata))
		}
		methods[i] = d.Metadata[s.MethodIndex-1]
	}
	return scopes, methods, nil
}
