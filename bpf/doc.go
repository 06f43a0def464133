// Package bpf loads sonde's kernel programs, attaches them to perf events and
// tracepoints, and hands what they record to user space. It is the only package
// that talks to the kernel's BPF interfaces; everything it emits is plain Go.
package bpf
