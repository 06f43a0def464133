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
}

// DefaultMaxBytes is how much a Namer caches per process unless told otherwise.
const DefaultMaxBytes = 8 << 20

// NamerStats counts what a Namer did.
type NamerStats struct {
	Compiled    uint64 // pcs of compiled code named by method
	Interpreted uint64 // interpreted frames named
	Stubs       uint64 // pcs in code the JVM generated itself, named by their blob
	Unnamed     uint64 // pcs and frames that could not be named: [jit] <blob name>
	Stale       uint64 // cached nmethods and methods found replaced at their address
	Evicted     uint64 // cache entries dropped for room
	Entries     int
	Bytes       int
}

func (s NamerStats) LogValue() slog.Value {
	return slog.GroupValue(slog.Uint64("compiled", s.Compiled), slog.Uint64("interpreted", s.Interpreted),
		slog.Uint64("stubs", s.Stubs), slog.Uint64("unnamed", s.Unnamed), slog.Uint64("stale", s.Stale),
		slog.Uint64("evicted", s.Evicted), slog.Int("entries", s.Entries), slog.Int("bytes", s.Bytes))
}

// Namer names a HotSpot process's code: pcs in its code cache and interpreted frames.
// What it reads is cached, bounded by NamerConfig.MaxBytes, and checked again at each
// use against what the process holds now (an nmethod's compile id and Method, a
// method's ConstMethod), so that code or a method freed and replaced at the same
// address is never named by what was there before.
type Namer struct {
	p   *Process
	max int

	mu       sync.Mutex
	nmethods map[uint64]*nmEntry // by the nmethod's address
	methods  map[uint64]*mEntry  // by Method*
	bytes    int
	stats    NamerStats
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
	return &Namer{p: p, max: cfg.MaxBytes, nmethods: map[uint64]*nmEntry{}, methods: map[uint64]*mEntry{}}
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
// why. A caller's pc (a return address, or one less) has a PcDesc of its own; a leaf's pc
// takes the next PcDesc's scopes, as HotSpot does for a pc between safepoints.
func (n *Namer) Compiled(pc uint64) ([]Frame, error) {
	b, err := n.p.BlobAt(pc)
	if err != nil {
		n.count(func(s *NamerStats) { s.Unnamed++ })
		return []Frame{unnamed("")}, fmt.Errorf("pc %#x: %w", pc, err)
	}
	if !b.NMethod {
		n.count(func(s *NamerStats) { s.Stubs++ })
		return []Frame{unnamed(b.Name)}, nil
	}
	frames, err := n.nmethodFrames(b, pc)
	if err != nil {
		n.count(func(s *NamerStats) { s.Unnamed++ })
		return []Frame{unnamed(b.Name)}, fmt.Errorf("pc %#x in nmethod %d at %#x: %w", pc, b.CompileID, b.Addr, err)
	}
	n.count(func(s *NamerStats) { s.Compiled++ })
	return frames, nil
}

func (n *Namer) nmethodFrames(b *Blob, pc uint64) ([]Frame, error) {
	d, err := n.debugInfo(b)
	if err != nil {
		return nil, err
	}
	if pc < b.CodeBegin || pc-b.CodeBegin > 1<<31 {
		return nil, errors.New("pc before the nmethod's code")
	}
	scopes, methods, err := n.p.ScopesAt(d, int32(pc-b.CodeBegin))
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
	size := entryOverhead + len(mi.Class) + len(mi.Name) + len(mi.Signature) + len(mi.File) + len(mi.Lines)*8 + len(mi.identity)
	n.mu.Lock()
	if n.makeRoom(size) {
		n.dropMethod(addr)
		n.methods[addr] = &mEntry{mi: mi, size: size}
		n.bytes += size
	}
	n.mu.Unlock()
	return mi, nil
}

// makeRoom drops entries until size more bytes fit, and says whether they do. Which
// entries go is left to the map's order: any one is as likely to be wanted again.
func (n *Namer) makeRoom(size int) bool {
	if size > n.max {
		return false
	}
	for n.bytes+size > n.max && len(n.nmethods)+len(n.methods) > 0 {
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
	return n.bytes+size <= n.max
}

func (n *Namer) dropNMethod(addr uint64) {
	if e, ok := n.nmethods[addr]; ok {
		n.bytes -= e.size
		delete(n.nmethods, addr)
	}
}

func (n *Namer) dropMethod(addr uint64) {
	if e, ok := n.methods[addr]; ok {
		n.bytes -= e.size
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
