// Package mmapfile maps files read-only, so that the tables the symbolizer and the
// unwinder read from binaries (Go's pclntab, .eh_frame, ELF symbol and string tables,
// uncompressed DWARF) cost the pages a lookup touches rather than a heap copy of each
// section.
//
// A mapping has a hazard a copy does not: the file can shrink while it is mapped
// (a process truncates or rewrites it in place), and reading a page past the new end
// raises SIGBUS, which kills a Go program. Guard runs code that reads mapped memory
// with the runtime's panic-on-fault enabled for its goroutine and turns such a fault
// into a *FaultError; the caller then drops the file and unmaps it. Code that
// recovers panics between the read and the Guard (parsers that turn a hostile
// input's panics into errors) hands a fault on as is: see Fault.
//
// A Region is unmapped by its owner's Close, not by a finalizer: a finalizer runs at
// the collector's leisure, and the symbolizer knows when a file leaves its cache.
// A cleanup unmaps a region its owner dropped unclosed, as a backstop only.
//
// Anon gives scratch memory outside the Go heap for large buffers without
// pointers whose end is known, such as a decompressed DWARF section: it goes back
// to the system at Close, not at the next collection, and does not count toward
// the collector's pacing.
package mmapfile
