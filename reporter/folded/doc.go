// Package folded writes and reads folded stacks, the one-line-per-stack text that
// flamegraph.pl, speedscope and most flame graph tools take: "root;caller;leaf count".
package folded
