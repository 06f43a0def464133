// Package ruby finds CRuby in the files processes map, tells the kernel how to walk its
// threads' control frames, and names the frames the kernel recorded.
//
// CRuby is a file exporting rb_vm_exec and the TLS variable ruby_current_ec: libruby.so, or
// a ruby linking it statically. Each file is inspected once per identity. The version is
// the one the file keeps for RUBY_VERSION (ruby_version); the layouts of the execution
// context, control frames and instruction sequences come from sonde's table by minor
// version (layout.go). The VM's loop, vm_exec_core, is a static function a stripped build
// names nowhere: it is the largest function rb_vm_exec branches to, found from rb_vm_exec's
// code and .eh_frame, and its out-of-line part as CPython's (interp.OutOfLinePart).
//
// Each thread's execution context is ruby_current_ec in its TLS: user space works out
// where it is per process (static TLS from the thread pointer, or a module's dynamic
// block), as package tracectx does for OpenTelemetry's thread context.
//
// The kernel records each Ruby frame as its instruction sequence's address and the
// position of its pc in it (package bpf, ruby.h). A Namer reads instruction sequences as
// soon as stacks first show them: the label CRuby gives the frame ("pluck", "block in
// harvest", "<main>"; 3.4 adds the class: "Orchard#pluck"), the file, and the line of the
// position from the sequence's line table (its positions, or the succinct bitvector CRuby
// keeps in their place). Everything read from a process is hostile: lengths are bounded,
// objects must have the type they should, and a failed read leaves the frame [ruby],
// counted.
package ruby
