// Package trace turns raw kernel samples into aggregated stacks: it keeps each sampled
// process's executable mappings from /proc, identifies mapped files by build ID, and counts
// identical (process, thread, stack) samples until an interval is flushed as a Profile.
package trace
