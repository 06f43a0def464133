package symbolize

import (
	"debug/elf"
	"fmt"

	"github.com/sonde-profiler/sonde/internal/objfile"
)

// DebugFetcher finds debug files that are not on this host, by build ID: package
// symbolize/debuginfod asks debuginfod servers for them.
type DebugFetcher interface {
	// DebugFile returns the path of a local file holding the debug information of
	// the build ID (lowercase hex), or "" when there is none yet; it may then fetch
	// one in the background, for a later call to find. It must not wait on the
	// network: it is called while an interval is named.
	DebugFile(buildID string) string
}

// maxAwaiting bounds the files remembered as waiting for a fetched debug file; past
// it the oldest are forgotten and keep the names they have.
const maxAwaiting = 4096

// fetchedDebugFile opens the debug file the fetcher has for buildID, if any. awaiting
// says the fetcher has none yet, so the file is to be read again once it has.
func fetchedDebugFile(fetcher DebugFetcher, buildID string) (d *debugFile, awaiting bool, err error) {
	if fetcher == nil || buildID == "" {
		return nil, false, nil
	}
	p := fetcher.DebugFile(buildID)
	if p == "" {
		return nil, true, nil
	}
	d, err = openDebugFile(p, objfile.OpenHost, func(df *elf.File, _ *objfile.Handle) error {
		if got := objfile.GNUBuildID(df); got != buildID {
			return fmt.Errorf("build id %q, want %q", got, buildID)
		}
		return nil
	})
	return d, false, err
}

// noticeDebugFile drops what was read of a file named without debug information once
// the fetcher has its debug file: the file and the names of its addresses, which are
// read again, with the new names, by this call. Names already handed to a profile
// stay: a location is named once.
func (s *Symbolizer) noticeDebugFile(ref *fileRef) {
	if s.load.fetcher == nil || len(s.awaiting) == 0 {
		return
	}
	buildID, ok := s.awaiting[ref.id]
	if !ok || s.load.fetcher.DebugFile(buildID) == "" {
		return
	}
	delete(s.awaiting, ref.id)
	if e, ok := s.files.Remove(ref.id); ok && e.obj != nil {
		s.closing = append(s.closing, e.obj)
	}
	if s.addrs != nil {
		s.addrs.RemoveFunc(func(k addrKey) bool { return k.file == ref.hash })
	}
	s.stats.DebugFilesFetched++
}

// await remembers that the file ref names has no debug information until the fetcher
// has buildID's.
func (s *Symbolizer) await(ref *fileRef, buildID string) {
	if len(s.awaiting) >= maxAwaiting {
		for k := range s.awaiting {
			delete(s.awaiting, k)
			if len(s.awaiting) < maxAwaiting/2 {
				break
			}
		}
	}
	s.awaiting[ref.id] = buildID
}
