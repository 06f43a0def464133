// Command fidelity profiles six real programs (xz, sqlite3, openssl speed, CPython, cc1plus,
// the Go compiler) with sonde and with perf record --call-graph dwarf at the same time, on
// the same process, and compares what each recorded: samples, complete stacks, the
// hottest functions by where they are rather than by what each tool names them, and
// unnamed leaves. It prints a table and rewrites the table of docs/fidelity.md. make
// fidelity runs it as root, after installing the programs; it is not part of make test.
package main
