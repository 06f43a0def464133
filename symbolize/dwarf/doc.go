// Package dwarf turns the DWARF debug information of an ELF file into a compact
// table that maps a code address to its source frames: the innermost function,
// file and line from the line table, then one frame per inlined call around it,
// the way addr2line -i and the OTLP and pprof Location.lines expect them.
//
// It reads DWARF 4 and 5, compressed sections included, through the standard
// library's debug/dwarf, decodes everything a lookup needs once, and then lets
// the raw sections go: the table keeps line rows, inline trees and names only,
// which is a fraction of the size of .debug_info. Hostile or broken input costs
// an error, never a panic, and the sections read are bounded in size beforehand.
package dwarf
