// Package unwind turns an object file's call frame information (.eh_frame, or .debug_frame
// where a file has none) into compact, sorted tables of rows that sonde's kernel unwinder
// walks: for each code range, how to find the canonical frame address (CFA), the return
// address and the caller's frame pointer. Tables depend only on the file, so one table
// serves every process that maps it.
package unwind
