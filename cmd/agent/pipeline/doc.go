// Package pipeline is sonde's stages, wired: the kernel's sampler feeds the process tracker
// and the aggregator, the tracker feeds the unwind table maintainer and the language
// runtimes, and every interval the aggregator's profile is symbolized and handed to the
// sinks (the collector, the output files, the top table, a live view). It also holds the
// memory governor, which divides --memory-limit among the stages (budget) and sheds caches
// under pressure, the /metrics endpoint, and the progress line.
//
// cmd/agent parses flags into a Config and calls Run, or Build and then Run for the
// subcommands that add to a run (sonde record, sonde top). Build makes every stage and
// starts nothing; a stage that holds something pushes its undoing as it is made, so that a
// later failure leaves nothing open.
package pipeline
