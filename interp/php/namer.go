package php

import (
	"time"

	"github.com/sonde-profiler/sonde/interp"
	"github.com/sonde-profiler/sonde/trace"
)

// NamerConfig configures a Namer: the Tracker's images, bounds (0: the defaults below).
type NamerConfig = interp.NamerConfig[Image]

// Defaults of NamerConfig.
const (
	DefaultMaxFunctions = 1 << 16
	DefaultMaxPending   = 4096
	// DefaultRecheck: about once an interval, each function still running is checked; a
	// php-fpm worker without opcache compiles its scripts again for every request.
	DefaultRecheck = 5 * time.Second
)

// retryFailed is how long after a failed read a function is read again when next seen.
const retryFailed = 500 * time.Millisecond

// unnamed is the name of a PHP frame whose function could not be read: the process ended,
// the request freed it.
const unnamed = "[php]"

// Namer names PHP frames: a function's name, its file, and the line its frame ran. Code
// is read as soon as a stack first shows it, while the process, and the request that
// compiled it, are most likely still there.
type Namer = interp.CodeNamer[*Function]

// NamerStats counts what a Namer did.
type NamerStats = interp.CodeNamerStats

// NewNamer returns a Namer; Run reads what SeenCode queues.
func NewNamer(cfg NamerConfig) *Namer {
	return interp.NewImageNamer(cfg, interp.ImageCode[Image, *Function]{
		Read:    (*Image).ReadCode,
		Print:   (*Image).readFingerprint,
		PrintOf: func(f *Function) [4]uint64 { return f.print },
		Lines: func(f *Function, line uint32) []trace.Line {
			return []trace.Line{{Function: f.Name, SystemName: f.Name, File: f.File, Line: int64(f.Line(line))}}
		},
		Unnamed:    unnamed,
		MaxCodes:   DefaultMaxFunctions,
		MaxPending: DefaultMaxPending,
		Recheck:    DefaultRecheck,
		Retry:      retryFailed,
	})
}
