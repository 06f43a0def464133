// Package node finds V8 (Node.js) in the files processes map, tells the kernel how to walk
// V8's frames, and names the frames the kernel recorded: each JavaScript function by its
// name, script and line, the functions an optimized function inlined each as its own frame.
//
// A file runs V8 when it carries V8's postmortem metadata, the v8dbg_* symbols: frame
// layout (where a frame keeps its context or frame type marker, its JSFunction and its
// bytecode offset), frame types, object field offsets and instance types. Everything
// sonde reads of V8 comes from there, none from a table of its own; the few slots V8 12's
// metadata leaves out (Node 22's: a function's data, a Code's deoptimization data and
// source positions) are told by the types of the objects they hold, checked at every
// read. A build whose metadata has the frame layout but not what naming reads is walked
// and its frames named [v8] (TrackerStats.Unnamed); one without the frame layout is
// counted and not walked (TrackerStats.Unsupported): nothing is guessed. The
// embedded builtins (Builtins_* in the file's symbol table) and the anonymous executable
// mappings (the JIT's code space) are V8's code, where the kernel walker takes over
// (bpf/v8.h).
//
// The kernel records an interpreted frame as its BytecodeArray and bytecode offset (where
// the interpreter's code is known: its entry trampolines and bytecode handlers, read from
// the symbols; else as its SharedFunctionInfo), a frame of compiled code as its pc. For
// both it keeps, by that address, the function it found in the frame (FunctionFinder),
// reading it from the V8 heap only when its CPU has not seen the pair of function and
// code lately: an interpreted frame is named by it once the function's bytecode is
// checked to be the frame's, a frame of baseline code (which does not say its function)
// once it is the code's. A Namer reads the rest from the process with
// process_vm_readv: for a pc, the InstructionStream holding it (found backwards from the pc
// by its map, checked by the Code object's pointer back to its instructions), its Code, the
// source position at the pc and, through the deoptimization data's inlining positions and
// literals, the chain of functions inlined there; for a SharedFunctionInfo, its bytecode's
// source positions. A function is named from its ScopeInfo (its name, else its inferred
// name, else <anonymous>), its file from its Script's name, its line from the Script's
// line ends, or from its source when V8 computed none.
//
// V8 moves and reuses objects: what is read is read soon after the sample (SeenCode),
// checked by type at every step, and read again after a while when stacks still show it;
// an address found naming something else renews the image's locations (OnReuse) so that
// earlier samples keep their names. What cannot be read is left unnamed and counted.
package node
