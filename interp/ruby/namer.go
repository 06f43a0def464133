package ruby

import (
	"time"

	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/trace"
)

// NamerConfig configures a Namer: the Tracker's images, bounds (0: the defaults below).
type NamerConfig = interp.NamerConfig[Image]

// Defaults of NamerConfig.
const (
	DefaultMaxIseqs   = 1 << 16
	DefaultMaxPending = 4096
	// DefaultRecheck: about once an interval, each sequence still running is checked: a
	// sequence the GC freed leaves its address to the next one allocated there.
	DefaultRecheck = 5 * time.Second
)

// retryFailed is how long after a failed read a sequence is read again when next seen.
const retryFailed = 500 * time.Millisecond

// unnamed is the name of a Ruby frame whose sequence could not be read: the process
// ended, the GC freed it.
const unnamed = "[ruby]"

// Namer names Ruby frames: the sequence's label, its file, and the line its frame ran.
type Namer = interp.CodeNamer[*Iseq]

// NamerStats counts what a Namer did.
type NamerStats = interp.CodeNamerStats

// NewNamer returns a Namer; Run reads what SeenCode queues.
func NewNamer(cfg NamerConfig) *Namer {
	return interp.NewImageNamer(cfg, interp.ImageCode[Image, *Iseq]{
		Read:    (*Image).ReadIseq,
		Print:   (*Image).readFingerprint,
		PrintOf: func(q *Iseq) [4]uint64 { return q.print },
		Lines: func(q *Iseq, pos uint32) []trace.Line {
			return []trace.Line{{Function: q.Label, SystemName: q.Label, File: q.File, Line: int64(q.Line(pos))}}
		},
		Unnamed:    unnamed,
		MaxCodes:   DefaultMaxIseqs,
		MaxPending: DefaultMaxPending,
		Recheck:    DefaultRecheck,
		Retry:      retryFailed,
	})
}
