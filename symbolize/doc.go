// Package symbolize names the code addresses of a trace.Profile on the host. It
// fills Location.Lines, innermost frame first, and records in Location.NameSource
// where the name came from, so that a user can see why a frame stayed an address:
//
//   - Go binaries, stripped or not: Go's own runtime tables (package gopclntab),
//     with files, lines and inlined calls.
//   - Other ELF files: DWARF line tables and inlined subroutines (package dwarf),
//     from the file or from a separate debug file found by build ID under the
//     debug directories or through .gnu_debuglink; then .symtab, then .dynsym,
//     for the enclosing function. C++ and Rust names are demangled into
//     Line.Function and kept as stored in Line.SystemName.
//   - Kernel frames: /proc/kallsyms, modules included, reread when an address
//     misses and the last read is old enough.
//   - Interpreted frames (CPython): the InterpNamer of Options, which reads code
//     objects from the process (package interp/python), in every mode.
//
// Mode "symtab" leaves DWARF out, "none" all of it. Locations that stay unnamed
// keep their address, mapping and build ID, from which a backend with better
// debug information can name them.
//
// A file is opened (through objfile.File.Open, so inside containers too) and parsed
// once however many processes map it: parsed files sit in an LRU cache keyed by
// build ID, and named addresses in a second LRU cache, both bounded in entries.
// Broken input (truncated or hostile ELF, DWARF or pclntab, files that vanished
// with their process) leaves frames unnamed and returns an error once per file;
// it does not panic, and the DWARF read for one file is bounded in size.
package symbolize
