// Package symbolize names the code addresses of a trace.Profile on the host. It
// fills Location.Lines, innermost frame first, and records in Location.NameSource
// where the name came from, so that a user can see why a frame stayed an address:
//
//   - Files with no debug information on the host: a DebugFetcher (package
//     debuginfod) may fetch it in the background; the file is named as without it
//     until it comes, and again, hot locations included, once it has.
//   - Go binaries, stripped or not: Go's own runtime tables (package gopclntab),
//     with files, lines and inlined calls.
//   - Other ELF files: DWARF line tables and inlined subroutines (package dwarf),
//     from the file or from a separate debug file found by build ID under the
//     debug directories or through .gnu_debuglink; then .symtab, then .dynsym,
//     for the enclosing function. C++ and Rust names are demangled into
//     Line.Function and kept as stored in Line.SystemName.
//   - What no symbol names: PLT entries as objdump names them (memcpy@plt, after the
//     relocation of the GOT slot they jump through), and, in an object without
//     .symtab, code by the .eh_frame FDE that covers it (liblzma.so.5+0x1a2b0, the
//     FDE's start), so that the samples of one function add up under one name.
//   - Kernel frames: /proc/kallsyms, modules included, reread when an address
//     misses and the last read is old enough.
//   - Frames of language runtimes: the InterpNamer of the frame's runtime in Options,
//     which reads the runtime's code from the process (a package under interp/), in
//     every mode.
//
// Mode "symtab" leaves DWARF out, "none" all of it. Locations that stay unnamed
// keep their address, mapping and build ID, from which a backend with better
// debug information can name them.
//
// A file is opened (through objfile.File.Open, so inside containers too), mapped
// read-only and parsed once however many processes map it: parsed files sit in an
// LRU cache keyed by build ID, the DWARF units lookups decoded in a second, shared
// by the files, and named addresses in a third. Each is bounded in bytes (as
// estimated, within a factor of the heap they take) and the first and last in
// entries too; none is allocated at its full size, they grow with use, and Shed
// drops them all for a watchdog that sees memory run short.
//
// Tables are read where they lie in the mapping rather than copied: Go's pclntab
// and inline trees, the entries and names of .symtab and .dynsym, uncompressed
// DWARF. What the heap holds per file is an index (symbols by address, DWARF units
// by address) and what lookups decoded. The pages lookups touch count in the
// process's resident set until they are given back, every few seconds at the end
// of a Symbolize call; they stay in the page cache. A mapped file that shrinks (a
// process truncates it) makes reads past its new end fault: lookups and loads run
// under mmapfile.Guard, which turns the fault into an error for that file, and the
// file is dropped and unmapped at the end of the call.
//
// Broken input (truncated or hostile ELF, DWARF or pclntab, files that vanished
// with their process) leaves frames unnamed and returns an error once per file;
// it does not panic, and the DWARF read for one file is bounded in size.
package symbolize
