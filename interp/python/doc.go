// Package python finds CPython interpreters in the files processes map, tells the kernel
// how to walk their threads' frames, and names the frames the kernel recorded.
//
// An interpreter is a file defining _PyRuntime and _PyEval_EvalFrameDefault: a python3
// binary linking the interpreter statically or libpython3.x.so. Each file is inspected once
// per identity (Inspect), whatever process maps it; a process that is not Python costs that
// one look per executable file. Offsets into the interpreter's structures come from
// the interpreter itself where it can tell: _Py_DebugOffsets, which CPython publishes in
// _PyRuntime for out-of-process tools since 3.13 (its layout differs by version: a table
// of where each version keeps each word), else the file's DWARF, else a table of the
// layouts of 3.9 to 3.12 keyed by the version the binary carries (Py_Version, or the
// version string). Nothing is taken from .symtab that a stripped build needs: the part of
// the eval loop gcc moves out of line (.cold), which Debian's builds run their opcodes in,
// is found from the branches of the exported head and .eh_frame (interp.OutOfLinePart).
// A free-threaded build (3.14t) differs in its object headers (32 bytes), its strings'
// state bits and its thread-local bytecode, all of which its _Py_DebugOffsets says but
// the state bits, which follow from the build.
//
// The kernel records each Python frame as the address of its code object and the
// instruction's offset (package bpf, python.h). A Namer reads code objects from the process
// with process_vm_readv, as soon as they are first seen rather than when the interval is
// flushed, so that short-lived processes are named too: qualified name, file, first line
// and line table, decoded per version (3.9's lnotab, 3.10's line table, 3.11's location
// table). Code objects are cached per image (one exec of a process) and address, and
// checked again when a stack shows them after a recheck period (about an interval): an
// address a freed code object left to another renews the image's interning space in the
// aggregator, so that its frames get new locations and the old ones keep the old name.
//
// Everything read from a process is hostile: lengths are bounded, objects must have the
// interpreter's code and string types, and a failed or nonsensical read leaves the frame
// unnamed and counted, never a panic.
package python
