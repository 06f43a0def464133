package bpf

// tableUnwinding: the kernel program's table walker knows amd64's call frame conventions.
const tableUnwinding = true
