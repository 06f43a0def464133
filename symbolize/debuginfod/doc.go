// Package debuginfod fetches separate debug files by build ID from debuginfod servers
// (the protocol of elfutils' debuginfod: GET /buildid/ID/debuginfo, /buildid/ID/executable)
// and keeps them in a directory on disk, for the symbolizer to name stripped code with.
//
// Nothing here runs on the symbolizer's path: DebugFile answers from memory or one
// stat(2), and queues a fetch that background workers, a bounded number of them, make
// later, no more often than a per-host interval allows. Every response is hostile input:
// its size is bounded before and while it streams to a temporary file next to its final
// place (never into memory), a server that sends nothing for Timeout or takes longer than
// MaxTime is abandoned, and a file is kept only once it parses as ELF, carries the GNU
// build ID asked for and has symbols or DWARF; then it is renamed into place, so that a
// reader sees a whole verified file or none. What failed, a 404 included, is not asked
// for again for NegativeTTL. The directory is bounded in bytes: past CacheBytes the
// files used least recently (by modification time, which a use sets) are removed.
//
// The cache's layout is the elfutils client's, CACHE/ID/debuginfo, and the configuration
// follows its environment: DEBUGINFOD_URLS, DEBUGINFOD_TIMEOUT, DEBUGINFOD_MAXTIME,
// DEBUGINFOD_MAXSIZE, DEBUGINFOD_CACHE_PATH and DEBUGINFOD_HEADERS_FILE.
package debuginfod
