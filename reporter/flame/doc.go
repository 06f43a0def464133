// Package flame draws profiles as flame graphs: it builds the call tree of a profile
// and writes it as a self-contained interactive HTML page (flame graph, top table and
// the run's facts) or as a standalone interactive SVG.
package flame
