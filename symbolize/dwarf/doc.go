// Package dwarf turns the DWARF debug information of an ELF file into a table that
// maps a code address to its source frames: the innermost function, file and line
// from the line table, then one frame per inlined call around it, the way
// addr2line -i and the OTLP and pprof Location.lines expect them.
//
// It reads DWARF 4 and 5, compressed sections included, and decodes lazily, a unit
// at a time. Load builds an index only: each unit's header, and the addresses its
// code takes, from .debug_aranges where that lists the unit, else from the ranges
// of the unit's DIE, else (dwz's partial units, odd producers) from the unit's
// lines and functions, decoded once at load. A lookup decodes the one unit covering
// its address, its line rows and its tree of functions and inlined calls, into a
// compact table kept in a Cache bounded in bytes and shared by the files of a
// symbolizer. References into other units (DW_FORM_ref_addr abstract origins and
// specifications, as LTO and dwz make them) are followed by reading the DIE where it
// lies, through its unit's abbreviations. Units are decoded alone, so a unit's
// lookups see its own line rows only: where the cold parts of several units'
// sequences interleave, an address gets its own unit's line, as binutils gives it.
//
// The DIEs are read by this package rather than debug/dwarf, which parses every
// unit's abbreviations when it opens the sections (12 MiB of heap for the C
// library) and keeps them; line programs still run through debug/dwarf's
// LineReader, over a Data made for one program.
//
// Given the file mapped (Options.File), uncompressed sections are read where they
// lie and never copied. Of compressed ones (SHF_COMPRESSED zlib or zstd, .zdebug),
// .debug_info, .debug_abbrev and .debug_line are decompressed a page at a time, as far
// as decoding reaches into them, into reserved anonymous memory whose pages cost nothing
// until written (lazy.go): Load walks them once, keeping a window and what the units of
// the addresses announced in Options.Want need; Prepare fetches what a pass's new units
// need in one more walk; Thin lets it go at the pass's end; Hold keeps every page once
// decompressed, for a file whose passes keep decoding new units. A zlib stream is
// decoded by the package's own inflater (inflate.go: whole-symbol code tables, a bit
// buffer filled a word at a time), which leaves a mark every 64 KB of output where a
// block begins (of its 32 KB window, the bytes the next window's copies reach back to,
// compressed, in anonymous memory too), so that a later walk starts near what it needs
// rather than at the section's start. A .debug_abbrev
// that passes keep walking from its marks is packed instead: its output kept in S2
// chunks, decoded where a need reaches. The other compressed sections, small, are
// decompressed whole when needed. All of it stays until Trim, and the compressed pages
// read are given back as the stream passes them (Options.Release).
// The copies lie in anonymous memory outside the Go heap.
//
// Hostile or broken input costs an error, never a panic: unit headers, unit DIEs
// and line program headers are checked at load, each unit when decoded, the
// sections read are bounded in size beforehand, and a compression header's size is
// not allocated before the stream yields it. A fault reading a mapped file (it
// shrank) comes back as the *mmapfile.FaultError it is, for the caller to drop the
// file.
package dwarf
