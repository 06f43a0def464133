// Package symbolize names the code addresses of a trace.Profile: it fills
// Location.Lines from the symbol tables of the ELF files the locations are
// mapped from and, for kernel frames, from /proc/kallsyms. It reads each file
// once and keeps compact, sorted tables so that naming a location stays a
// binary search; richer sources (DWARF line tables, Go pclntab) are meant to
// slot in beside the ELF symbol table without changing the Symbolizer's API.
package symbolize
