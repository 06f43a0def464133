package pipeline

import (
	"log/slog"

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
