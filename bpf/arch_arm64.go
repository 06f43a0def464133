package bpf

// tableUnwinding: arm64 objects are built without the table walker (see arch_arm64.h);
// user stacks are walked by frame pointer.
const tableUnwinding = false
