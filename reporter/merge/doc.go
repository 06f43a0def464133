// Package merge combines and narrows profiles read back from files for sonde view:
// Merge sums profiles into one, Filter keeps the samples asked for.
package merge
