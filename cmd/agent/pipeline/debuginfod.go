package pipeline

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/sonde-profiler/sonde/symbolize/debuginfod"
)

// newDebuginfod makes the client that fetches debug files for the symbolizer, or nil
// when no server is configured. A cache directory that cannot be made costs the
// names it would have given, not the run.
func newDebuginfod(cfg debuginfod.Config, log *slog.Logger) *debuginfod.Client {
	if len(cfg.URLs) == 0 {
		return nil
	}
	cfg.OnError = func(err error) {
		log.Warn("debuginfod fetch failed; this server's failures of the kind are counted in /metrics, not logged again", "err", err)
	}
	c, err := debuginfod.New(cfg)
	if err != nil {
		log.Warn("debuginfod disabled; stripped code keeps the names it has", "err", err)
		return nil
	}
	log.Info("debuginfod", "urls", cfg.URLs, "cache_dir", cfg.CacheDir, "cache_bytes", cfg.CacheBytes)
	return c
}

// maxDebugWait bounds how long a run's end waits for debug files it asked for: a person
// waits for the profile.
const maxDebugWait = 5 * time.Second

// awaitDebugFiles waits, at the end of a run that writes its profile once (--duration,
// --pid, sonde record), for the debug files its last naming asked debuginfod for, at most
// the smaller of DEBUGINFOD_TIMEOUT and maxDebugWait, and reports whether the last
// interval is to be named again with what came. Fetches start when a file is first named, which
// for a short run is its end: without the wait, its first run would name nothing from
// them. The continuous agent does not wait: its next interval has what came.
func (p *Pipeline) awaitDebugFiles() bool {
	if p.debuginfod == nil || (p.cfg.Duration == 0 && len(p.cfg.PIDs) == 0) {
		return false
	}
	// A fetch that ended already, during the naming, counts too: the naming did not
	// have its file yet.
	wait := min(maxDebugWait, cmp.Or(p.cfg.Debuginfod.Timeout, debuginfod.DefaultTimeout))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	t0 := time.Now()
	left := p.debuginfod.Settle(ctx)
	if left > 0 {
		p.log.Info("debuginfod: gave up waiting for debug files at the end of the run; their frames keep the names they have",
			"waited", time.Since(t0).Round(time.Millisecond), "pending", left)
	}
	return true
}
