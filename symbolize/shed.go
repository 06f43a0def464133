package symbolize

import "log/slog"

// LogValue puts the counts that matter in a log line under their metric names.
func (s Stats) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int("files_loaded", s.FilesLoaded), slog.Int("files_failed", s.FilesFailed), slog.Int("debug_info_failed", s.DebugInfoFailed),
		slog.Int("cached_files", s.CachedFiles), slog.Int64("cached_file_bytes", s.CachedFileBytes),
		slog.Int("locations_named", s.LocationsNamed), slog.Int("locations_unnamed", s.LocationsUnnamed), slog.Int("sheds", s.Sheds), slog.Int64("shed_bytes", s.ShedBytes),
		slog.Int64("cached_dwarf_bytes", s.CachedDWARFBytes), slog.Int("files_faulted", s.FilesFaulted),
		slog.Int64("decompressed_peak_bytes", s.DecompressedPeakBytes), slog.Int64("decompressed_total_bytes", s.DecompressedTotalBytes), slog.Int("decompress_refused", s.DecompressRefused))
}
