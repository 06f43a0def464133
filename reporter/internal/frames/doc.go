// Package frames names the frames of a sample the same way in every human-readable
// output (folded stacks, flame graphs, filters), and makes hostile names printable.
package frames
