// Package jvm finds HotSpot JVMs among the files processes map and names their code: a
// pc in the code cache by the Java methods compiled there, innermost inlined method
// first, and an interpreted frame by its Method* and bytecode pointer. It is the host
// side of sonde's Java support; the kernel walker that collects JVM frames is bpf/jvm.h,
// which walks them inside the native walk (HotSpot's compiled code keeps no frame
// pointer) from the state KernelState reads here.
//
// Runtime is what the agent drives, as it drives every language runtime. Its Tracker
// looks at each process's mappings: a process that maps no libjvm.so costs a look at
// their paths; one that does has its tables read once per exec, and its KernelState (for
// that exec) written through its interp.Kernel when it changes. A JVM found before it set up its
// code cache (ErrNotReady) is read again at its next mappings or after a short wait,
// whichever comes first, a bounded number of times; a process gone, or exec'd, is
// deleted from the kernel and its Namer's cache dropped.
// The kernel writes each Java frame as runtime Number's 58 bits: a pc of the code cache
// with whether it is a return address and the low byte of its nmethod's compile id, or
// a Method* and bci (EncodeCodeFrame, EncodeInterpretedFrame, DecodeFrame). The Runtime
// reads what a frame's code names as soon as a stack shows it (SeenCode, Run), while the
// process lives, and names locations from that (Name): a return address by the PcDesc
// at exactly its offset, any other pc by the next one (CompiledAt); a pc whose nmethod
// has another compile id than the frame's is another compilation's code, named [jit]
// and its blob's name. Config.MaxBytes bounds all it keeps, the processes' Namers
// included.
//
// A process runs HotSpot when it maps libjvm.so exporting the serviceability globals
// that out-of-process tools (the Serviceability Agent) read: gHotSpotVMStructs,
// gHotSpotVMTypes, gHotSpotVMIntConstants, gHotSpotVMLongConstants and the offsets and
// strides of their entries. Inspect reads those symbols from the file once; NewProcess
// reads the tables from the process (relocated by libjvm's load bias) and NewLayout turns
// them into the offsets and sizes sonde reads with: the code cache's heaps and segment
// maps, code blobs and nmethods, PcDescs, Method, ConstMethod, ConstantPool, Klass,
// Symbol, and the interpreter's frame slots. Nothing is taken from a table of versions
// of sonde's own: JDK 17 and 25 differ (CodeBlob's code begins at a pointer or an offset,
// JDK 25 tells a blob's kind and keeps an nmethod's debug info in separate immutable and
// mutable blocks, ConstMethod's flags became a struct, HeapBlock's length shrank) and
// each is recognised by the fields its tables list. A field naming needs that a build
// lacks is an error naming it (ErrMissing). Two things the tables do not say come from
// elsewhere, each stated where it is used: the encoding of the compressed streams (one
// byte value excluded from JDK 20, told by the version the JVM reports) and, on x86_64
// where only two interpreter frame slots are published, the others as frame_x86.hpp
// defines them from those (FrameLayout.Derived).
//
// A Namer finds a pc's code blob as the JVM does, through the code heap's segment map;
// for an nmethod it decodes the PcDesc at the pc and the scope chain it points to
// (DebugInfoReadStream), and names each scope's Method from its class's name, the
// ConstantPool's symbols and the compressed line number table. A Method must be among
// its class's methods to be named. What it reads is cached within a byte bound, and each
// use checks the cache against the process (the nmethod's compile id and Method, the
// Method's ConstMethod), so that code compiled later at the same address is never named
// by what was there before. What cannot be named is the frame "[jit] <blob name>", with
// the error counted (NamerStats.Unnamed): never a guessed method.
//
// Everything read from a process is hostile: every loop and length is bounded, and a
// read that fails or makes no sense is an error, never a panic.
package jvm
