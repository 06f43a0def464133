package symbolize

import "log/slog"

// Shed drops the parsed files and named addresses the caches hold, to give memory back
// under pressure; later lookups read the files again. It returns the bytes the file cache
// held by its estimate.
func (s *Symbolizer) Shed() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	freed := s.cachedBytes
	if s.files != nil {
		s.files.Purge()
	}
	if s.addrs != nil {
		s.addrs.Purge()
	}
	s.stats.Sheds++
	return freed
}

func (s Stats) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int("files_loaded", s.FilesLoaded), slog.Int("files_failed", s.FilesFailed), slog.Int("debug_info_failed", s.DebugInfoFailed),
		slog.Int("cached_files", s.CachedFiles), slog.Int64("cached_file_bytes", s.CachedFileBytes),
		slog.Int("locations_named", s.LocationsNamed), slog.Int("locations_unnamed", s.LocationsUnnamed), slog.Int("sheds", s.Sheds))
}
