package jvm

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
)

// Frame is one Java frame as named: a method, or code of the JVM's own ([jit] and the
// code blob's name) when the method cannot be told.
type Frame struct {
	Function  string // java.lang.String.indexOf, or [jit] <blob name>
	Class     string // java.lang.String; "" when unnamed
	Name      string // indexOf
	Signature string // (II)I
	File      string // String.java; "" when the class says none
	Line      int32  // -1: unknown
	BCI       int32  // -1: unknown
	Method    uint64 // the Method*, 0 when unnamed
	// Inlined says the frame's code was compiled into the next frame's: the frames of
	// one pc are its inlining chain, innermost first.
	Inlined bool
}

// JITPrefix starts the name of code that is not a named Java method.
const JITPrefix = "[jit] "

func unnamed(blob string) Frame {
	if blob == "" {
		blob = "unknown"
	}
	return Frame{Function: JITPrefix + blob, Line: -1, BCI: -1}
}

func frameOf(mi *MethodInfo, bci int32) Frame {
	f := Frame{Function: mi.Function(), Class: mi.Class, Name: mi.Name, Signature: mi.Signature, File: mi.File,
		Line: -1, BCI: bci, Method: mi.Method}
	if bci >= 0 {
		f.Line = mi.Line(bci)
	}
	return f
}

// NamerConfig configures a Namer.
type NamerConfig struct {
	// MaxBytes bounds what the Namer caches (decoded debug info, methods' names and line
	// tables); 0 means DefaultMaxBytes.
	MaxBytes int
	// shared, when set, bounds what this Namer and others (one per process) cache
	// together: a Namer makes room in its own cache for what the bound refuses.
	shared *budget
}

// budget is a bound of bytes that several caches share.
type budget struct {
	mu        sync.Mutex
	max, used int
}

func newBudget(max int) *budget { return &budget{max: max} }

// take reserves n bytes, and says whether they fit; a nil budget has room for all.
func (b *budget) take(n int) bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.max {
		return false
	}
	b.used += n
	return true
}

func (b *budget) give(n int) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

func (b *budget) inUse() int {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// DefaultMaxBytes is how much a Namer caches per process unless told otherwise.
const DefaultMaxBytes = 8 << 20

// NamerStats counts what a Namer did.
type NamerStats struct {
	Compiled    uint64 // pcs of compiled code named by method
	Interpreted uint64 // interpreted frames named
	Stubs       uint64 // pcs in code the JVM generated itself, named by their blob
	Unnamed     uint64 // pcs and frames that could not be named: [jit] <blob name>
	// Recompiled counts pcs whose nmethod was not the compilation the kernel walker saw
	// (another compile id): [jit] <blob name>, as the scopes there are another's.
	Recompiled uint64
	// Outermost counts return addresses without a PcDesc of their own (a call into
	// code that records no debug info): named by their nmethod's method, no line.
	Outermost uint64
	Stale     uint64 // cached nmethods and methods found replaced at their address
	Evicted   uint64 // cache entries dropped for room
	Entries   int
	Bytes     int
}

func (s *NamerStats) add(o NamerStats) {
	s.Compiled += o.Compiled
	s.Interpreted += o.Interpreted
	s.Stubs += o.Stubs
	s.Unnamed += o.Unnamed
	s.Recompiled += o.Recompiled
	s.Outermost += o.Outermost
	s.Stale += o.Stale
	s.Evicted += o.Evicted
	s.Entries += o.Entries
	s.Bytes += o.Bytes
}

func (s NamerStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Uint64("compiled", s.Compiled), slog.Uint64("interpreted", s.Interpreted),
		slog.Uint64("stubs", s.Stubs), slog.Uint64("unnamed", s.Unnamed), slog.Uint64("recompiled", s.Recompiled),
		slog.Uint64("outermost", s.Outermost), slog.Uint64("stale", s.Stale),
		slog.Uint64("evicted", s.Evicted), slog.Int("entries", s.Entries), slog.Int("bytes", s.Bytes))
}

// Namer names a HotSpot process's code: pcs in its code cache and interpreted frames.
// What it reads is cached, bounded by NamerConfig.MaxBytes, and checked again at each
// use against what the process holds now (an nmethod's compile id and Method, a
// method's ConstMethod), so that code or a method freed and replaced at the same
// address is never named by what was there before.
type Namer struct {
	p      *Process
	max    int
	shared *budget

	mu       sync.Mutex
	nmethods map[uint64]*nmEntry // by the nmethod's address
	methods  map[uint64]*mEntry  // by Method*
	bytes    int
	stats    NamerStats
	closed   bool // released: caches nothing more
}

type nmEntry struct {
	compileID      int32
	method         uint64
	codeBegin, end uint64
	d              *DebugInfo
	size           int
}

type mEntry struct {
	mi   *MethodInfo
	size int
}

// entryOverhead is what an entry costs beyond its data, for the bound.
const entryOverhead = 128

// NewNamer returns a Namer of process p.
func NewNamer(p *Process, cfg NamerConfig) *Namer {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	return &Namer{p: p, max: cfg.MaxBytes, shared: cfg.shared, nmethods: map[uint64]*nmEntry{}, methods: map[uint64]*mEntry{}}
}

// release empties the cache, giving its bytes back to the shared bound, and keeps it
// empty: the process is gone, though a read under way may still end.
func (n *Namer) release() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	for a := range n.nmethods {
		n.dropNMethod(a)
	}
	for a := range n.methods {
		n.dropMethod(a)
	}
}

// Stats returns the counts so far.
func (n *Namer) Stats() NamerStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.stats
	s.Entries, s.Bytes = len(n.nmethods)+len(n.methods), n.bytes
	return s
}

func (n *Namer) count(f func(*NamerStats)) {
	n.mu.Lock()
	f(&n.stats)
	n.mu.Unlock()
}

// Compiled names a pc in the code cache: for an nmethod, its inlining chain at the pc,
// innermost first, each method its own frame; for other code, the code blob's name. The
// frames are always usable: what cannot be named is one [jit] frame, and the error says
// why. The pc takes the first PcDesc at or after it, as HotSpot does for a pc between
// safepoints; a return address has one of its own, found so too (CompiledAt tells one
// from the other).
func (n *Namer) Compiled(pc uint64) ([]Frame, error) { return n.CompiledAt(pc, false, -1) }

// ErrRecompiled: the nmethod at a pc is not the compilation a kernel walker found there
// (its compile id differs), so that its debug info may describe other code.
var ErrRecompiled = errors.New("the nmethod at the pc was compiled after the frame was sampled")

// CompiledAt names a pc as a kernel walker reports it. A return address (ret: a
// caller's frame) names the PcDesc recorded at exactly its offset, HotSpot's own for the
// call; without one (a call that records no debug info) the frame is the nmethod's
// method alone, without a line. Any other pc (the leaf's, or one a signal interrupted)
// takes the next PcDesc, as Compiled does. compileTag, unless negative, is the low byte
// of the compile id the walker read at the pc's blob: an nmethod with another is a later
// compilation at the same address, named by its blob ([jit] nmethod), never by its
// methods, with ErrRecompiled. For other blobs compileTag says nothing.
func (n *Namer) CompiledAt(pc uint64, ret bool, compileTag int) ([]Frame, error) {
	b, err := n.p.BlobAt(pc)
	if err != nil {
		n.count(func(s *NamerStats) { s.Unnamed++ })
		return []Frame{unnamed("")}, fmt.Errorf("pc %#x: %w", pc, err)
	}
	if !b.NMethod {
		n.count(func(s *NamerStats) { s.Stubs++ })
		return []Frame{unnamed(b.Name)}, nil
	}
	if compileTag >= 0 && uint8(b.CompileID) != uint8(compileTag) {
		n.count(func(s *NamerStats) { s.Recompiled++ })
		return []Frame{unnamed(b.Name)}, fmt.Errorf("pc %#x in nmethod %d at %#x, sampled in compile %d (low byte): %w",
			pc, b.CompileID, b.Addr, compileTag, ErrRecompiled)
	}
	frames, err := n.nmethodFrames(b, pc, ret)
	if err != nil {
		n.count(func(s *NamerStats) { s.Unnamed++ })
		return []Frame{unnamed(b.Name)}, fmt.Errorf("pc %#x in nmethod %d at %#x: %w", pc, b.CompileID, b.Addr, err)
	}
	n.count(func(s *NamerStats) { s.Compiled++ })
	return frames, nil
}

func (n *Namer) nmethodFrames(b *Blob, pc uint64, ret bool) ([]Frame, error) {
	d, err := n.debugInfo(b)
	if err != nil {
		return nil, err
	}
	if pc < b.CodeBegin || pc-b.CodeBegin > 1<<31 {
		return nil, errors.New("pc before the nmethod's code")
	}
	off := int32(pc - b.CodeBegin)
	var scopes []Scope
	var methods []uint64
	if ret {
		pd, ok := d.PcDescExact(off)
		if !ok {
			// The next PcDesc may be another inlined method's: only the nmethod's own
			// method is sure.
			mi, err := n.method(b.Method)
			if err != nil {
				return nil, err
			}
			n.count(func(s *NamerStats) { s.Outermost++ })
			return []Frame{frameOf(mi, -1)}, nil
		}
		scopes, methods, err = n.p.scopesOf(d, pd)
	} else {
		scopes, methods, err = n.p.ScopesAt(d, off)
		if err == nil && len(scopes) == 0 {
			// Past the last safepoint with debug info (the sentinel PcDesc, or code that
			// records none after the pc: C1's loops keep one PcDesc at their back edge).
			// The last PcDesc before the pc is the same method, where it did not inline:
			// only its outermost scope is sure to be the nmethod's own method.
			if pd, ok := d.PcDescBefore(off); ok {
				if scopes, methods, err = n.p.scopesOf(d, pd); err == nil && len(scopes) > 1 {
					scopes, methods = scopes[len(scopes)-1:], methods[len(methods)-1:]
				}
			}
		}
	}
	if err != nil {
		return nil, err
	}
	if len(scopes) == 0 {
		// No debug info at the pc (an entry or a stub of the nmethod): its method, no line.
		mi, err := n.method(b.Method)
		if err != nil {
			return nil, err
		}
		return []Frame{frameOf(mi, -1)}, nil
	}
	// The outermost scope is the nmethod's own method: decoding that ends anywhere else
	// is not trusted with a name.
	if methods[len(methods)-1] != b.Method {
		return nil, fmt.Errorf("outermost scope's method %#x is not the nmethod's %#x", methods[len(methods)-1], b.Method)
	}
	frames := make([]Frame, len(scopes))
	for i, s := range scopes {
		mi, err := n.method(methods[i])
		if err != nil {
			return nil, err
		}
		frames[i] = frameOf(mi, s.BCI)
		frames[i].Inlined = i < len(scopes)-1
	}
	return frames, nil
}

// debugInfo returns an nmethod's debug info, cached while the same compilation of the
// same method occupies the address.
func (n *Namer) debugInfo(b *Blob) (*DebugInfo, error) {
	n.mu.Lock()
	e := n.nmethods[b.Addr]
	if e != nil && (e.compileID != b.CompileID || e.method != b.Method || e.codeBegin != b.CodeBegin || e.end != b.End) {
		n.stats.Stale++
		n.dropNMethod(b.Addr)
		e = nil
	}
	n.mu.Unlock()
	if e != nil {
		return e.d, nil
	}
	d, err := n.p.ReadDebugInfo(b)
	if err != nil {
		return nil, err
	}
	e = &nmEntry{compileID: b.CompileID, method: b.Method, codeBegin: b.CodeBegin, end: b.End, d: d,
		size: d.Size() + entryOverhead}
	n.mu.Lock()
	if n.makeRoom(e.size) {
		n.dropNMethod(b.Addr)
		n.nmethods[b.Addr] = e
		n.bytes += e.size
	}
	n.mu.Unlock()
	return d, nil
}

// method returns a method's names and lines, cached while its ConstMethod stays.
func (n *Namer) method(addr uint64) (*MethodInfo, error) {
	n.mu.Lock()
	e := n.methods[addr]
	n.mu.Unlock()
	if e != nil {
		if n.p.stillSame(e.mi) {
			return e.mi, nil
		}
		n.mu.Lock()
		n.stats.Stale++
		n.dropMethod(addr)
		n.mu.Unlock()
	}
	mi, err := n.p.ReadMethod(addr)
	if err != nil {
		return nil, err
	}
	size := methodSize(mi)
	n.mu.Lock()
	if n.makeRoom(size) {
		n.dropMethod(addr)
		n.methods[addr] = &mEntry{mi: mi, size: size}
		n.bytes += size
	}
	n.mu.Unlock()
	return mi, nil
}

// methodSize is what a method's names and lines cost a cache.
func methodSize(mi *MethodInfo) int {
	return entryOverhead + len(mi.Class) + len(mi.Name) + len(mi.Signature) + len(mi.File) + len(mi.Lines)*8 + len(mi.identity)
}

// makeRoom drops entries until size more bytes fit, within the Namer's bound and the
// bound it shares, and says whether they do; when they do, the shared bound holds them.
// Which entries go is left to the map's order: any one is as likely to be wanted again.
// What others hold of the shared bound is theirs: a Namer that finds it full and has
// nothing to drop caches nothing, and reads again each time.
func (n *Namer) makeRoom(size int) bool {
	if size > n.max || n.closed {
		return false
	}
	for {
		if n.bytes+size <= n.max && n.shared.take(size) {
			return true
		}
		if len(n.nmethods)+len(n.methods) == 0 {
			return false
		}
		// Debug info first: it is the larger, and read again from one place.
		dropped := false
		for a := range n.nmethods {
			n.dropNMethod(a)
			dropped = true
			break
		}
		if !dropped {
			for a := range n.methods {
				n.dropMethod(a)
				break
			}
		}
		n.stats.Evicted++
	}
}

func (n *Namer) dropNMethod(addr uint64) {
	if e, ok := n.nmethods[addr]; ok {
		n.bytes -= e.size
		n.shared.give(e.size)
		delete(n.nmethods, addr)
	}
}

func (n *Namer) dropMethod(addr uint64) {
	if e, ok := n.methods[addr]; ok {
		n.bytes -= e.size
		n.shared.give(e.size)
		delete(n.methods, addr)
	}
}

// Interpreted names an interpreted frame from what the frame holds: its Method* and
// bytecode pointer.
func (n *Namer) Interpreted(method, bcp uint64) (Frame, error) {
	mi, err := n.method(method)
	if err != nil {
		n.count(func(s *NamerStats) { s.Unnamed++ })
		return unnamed("interpreter"), err
	}
	bci, err := n.p.BCIOf(mi, bcp)
	if err != nil {
		// The method is known, its position not: named without a line.
		bci = -1
	}
	n.count(func(s *NamerStats) { s.Interpreted++ })
	return frameOf(mi, bci), nil
}

// interpretedMethod reads the method of an interpreted frame, counted as Interpreted
// or Unnamed.
func (n *Namer) interpretedMethod(method uint64) (*MethodInfo, error) {
	mi, err := n.method(method)
	n.count(func(s *NamerStats) {
		if err != nil {
			s.Unnamed++
		} else {
			s.Interpreted++
		}
	})
	return mi, err
}

// InterpretedBCI names a frame of method at bci (from a kernel walker that turned the
// bytecode pointer into a bci already).
func (n *Namer) InterpretedBCI(method uint64, bci int32) (Frame, error) {
	mi, err := n.method(method)
	if err != nil {
		n.count(func(s *NamerStats) { s.Unnamed++ })
		return unnamed("interpreter"), err
	}
	if bci >= int32(mi.CodeSize) {
		bci = -1
	}
	n.count(func(s *NamerStats) { s.Interpreted++ })
	return frameOf(mi, bci), nil
}
