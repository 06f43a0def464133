// Package gopclntab names the code addresses of Go binaries from the runtime's own
// tables, .gopclntab, which every Go binary keeps because the runtime needs them
// for tracebacks: stripping (-ldflags=-s -w, strip -s) removes symbols and DWARF
// but not these, so they name frames where nothing else can.
//
// For Go 1.18 and later it decodes the tables itself, functions, files and lines,
// and also inlining, which debug/gosym leaves out: the FUNCDATA_InlTree array of
// each function and its PCDATA_InlTreeIndex table give, for an address inside
// inlined code, the chain of inlined calls, the same frames runtime.CallersFrames
// reports. The inline trees live in the go:func.* data that moduledata.gofunc
// locates; stripped binaries have no symbol for it, so the package finds the
// moduledata (the .go.module section of Go 1.26, else a scan of the data
// sections for a pointer to the pclntab) and checks it against the header before
// trusting it. Without it, addresses still get functions, files and lines.
//
// Given the file mapped, a Table reads the pclntab and the inline trees where they
// lie and holds a few hundred bytes on the heap; the pages a lookup touches (a
// binary search of the function table, one function's tables and names) are all it
// makes resident. The caller keeps the mapping while it uses the table and reads
// it under mmapfile.Guard, for a file truncated under its mapping faults. Without a
// mapping the table copies the pclntab and every inline tree.
//
// Binaries of Go 1.2 to 1.17 are read through debug/gosym: function, file and
// line of the physical function, no inlined frames.
package gopclntab
