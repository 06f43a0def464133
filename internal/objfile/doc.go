// Package objfile is sonde's one way into the object files that sampled processes map.
// Every such file is hostile input: a process can put a FIFO, a device or a socket where
// its library was, make a path a symlink out of its container, grow or truncate a file
// while sonde reads it, or hand over a corrupt ELF. So a file is opened without blocking
// and without side effects (O_PATH first, then reopened for reading only once fstat shows
// a regular file that is the very inode the process maps), through
// /proc/PID/map_files or, resolved inside the process's root, /proc/PID/root, read within
// the size fstat reported, and parsed by an ELF reader that turns debug/elf's panics into
// errors. The package also names a file's contents: build IDs from its notes, else a hash
// of its head and tail, which is what the unwinder's and the symbolizer's caches key on.
package objfile
