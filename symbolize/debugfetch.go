package symbolize

import (
	"debug/elf"
	"fmt"
	"slices"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/trace"
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

// maxAwaiting bounds the files remembered as waiting for a fetched debug file, and
// those remembered as having got one; past it some are forgotten and keep the names
// they have.
const maxAwaiting = 4096

// maxRenamed bounds the locations named again after their file's debug file came, and
// kept for the intervals that bring them again.
const maxRenamed = 8192

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

// renameFetched brings the debug files the fetcher came to have into p, before p's
// locations are named. A file awaiting one is dropped with the names of its addresses,
// so that it is read again, with the debug file. Locations of such files that an
// earlier call named (they outlive their interval in the collector's cache) must not
// be written again: profiles handed on may be read meanwhile. They are replaced, in
// p only, by fresh copies that this call names; the copy of each is kept, so that the
// next intervals, which get the same stale location, get the same copy.
func (s *Symbolizer) renameFetched(p *trace.Profile) {
	if s.load.fetcher == nil || (len(s.awaiting) == 0 && s.fetched.Len() == 0) {
		return
	}
	checked := map[*objfile.File]bool{} // whether the file's debug file was fetched
	var renames map[*trace.Location]*trace.Location
	for _, loc := range p.Locations {
		if loc == nil || loc.Mapping == nil || loc.Mapping.File == nil || loc.Kind == trace.FrameKernel || loc.Kind == trace.FrameInterp {
			continue
		}
		f := loc.Mapping.File
		fetched, ok := checked[f]
		if !ok {
			fetched = s.noticeDebugFile(f.ID())
			checked[f] = fetched
		}
		if !fetched || !staleSource(loc.NameSource) {
			continue
		}
		r, ok := s.fetched.Get(loc)
		if !ok {
			r = &trace.Location{Kind: loc.Kind, Address: loc.Address, Mapping: loc.Mapping}
			s.fetched.Add(loc, r, 1)
			s.stats.LocationsRenamed++
		}
		if renames == nil {
			renames = map[*trace.Location]*trace.Location{}
		}
		renames[loc] = r
	}
	if len(renames) == 0 {
		return
	}
	for i, loc := range p.Locations {
		if r, ok := renames[loc]; ok {
			p.Locations[i] = r
		}
	}
	// A sample's Locations are its own; its chunks are shared with the collector and
	// earlier profiles, so a chunk with a stale location is copied, once per profile,
	// and the copy shared by the samples that had the chunk.
	copies := map[*trace.Location][]*trace.Location{} // by the chunk's first element
	for _, smp := range p.Samples {
		if smp == nil {
			continue
		}
		for i, loc := range smp.Locations {
			if r, ok := renames[loc]; ok {
				smp.Locations[i] = r
			}
		}
		for i, ch := range smp.Chunks {
			if len(ch) == 0 {
				continue
			}
			if c, ok := copies[ch[0]]; ok && len(c) == len(ch) {
				smp.Chunks[i] = c
				continue
			}
			var c []*trace.Location
			for j, loc := range ch {
				if r, ok := renames[loc]; ok {
					if c == nil {
						c = slices.Clone(ch)
					}
					c[j] = r
				}
			}
			if c != nil {
				copies[ch[0]] = c
				smp.Chunks[i] = c
			}
		}
	}
}

// staleSource says whether a name may be bettered by a debug file: names by FDE, by
// .dynsym or none. Names from a debug file's DWARF or .symtab were given since it came.
func staleSource(source string) bool {
	return source == SourceFDE || source == SourceDynsym || source == SourceNone
}

// noticeDebugFile reports whether the fetcher has the debug file of a file that awaited
// one, now or before. The first time, what was read of the file goes: the file and the
// names of its addresses.
func (s *Symbolizer) noticeDebugFile(id fileID) bool {
	if _, ok := s.arrived[id]; ok {
		return true
	}
	buildID, ok := s.awaiting[id]
	if !ok || s.load.fetcher.DebugFile(buildID) == "" {
		return false
	}
	delete(s.awaiting, id)
	if len(s.arrived) >= maxAwaiting {
		clear(s.arrived)
	}
	s.arrived[id] = struct{}{}
	if e, ok := s.files.Remove(id); ok && e.obj != nil {
		s.closing = append(s.closing, e.obj)
	}
	if s.addrs != nil {
		h := s.fileHash(id)
		s.addrs.RemoveFunc(func(k addrKey) bool { return k.file == h })
	}
	s.stats.DebugFilesFetched++
	return true
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
