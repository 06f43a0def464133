// Package walkmodel is the Go model of the kernel's stack walker (bpf/unwinder.h), step for
// step: from a thread's registers, through a process's mappings and their files' unwind
// tables (package unwind's rows), to the frames and how the walk ended. It is for tests:
// package bpf's hold the kernel's walks to it, and package unwind's hold its rows' rules to
// what they compute; sonde itself never walks a stack in Go.
package walkmodel
