package pipeline

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sonde-profiler/sonde/internal/procfs"
)

// releaseOwnCode gives back the page-table entries of sonde's executable where it is
// mapped read-only (code, read-only data, Go's tables) and returns how many bytes it
// covered. Every package's initialisation runs at start-up, spread across the
// executable, and the kernel maps up to 16 pages around each page it faults in: a run
// that never uses the Kubernetes client or the Prometheus machinery still held most of
// the executable resident (18 MB before the first sample, 24 MB in a steady run). The
// pages stay in the page cache; those still used fault back in at a minor fault's cost.
// Private read-only mappings of a file hold nothing but the file's contents, so
// MADV_DONTNEED loses nothing there; writable mappings are left alone.
//
// With exact, the pages that come back afterwards are only those a run touches: the
// mappings are marked for random access and the executable's pages that no one maps
// leave the page cache (dropOwnCache). A fault maps the pages around it that are in the
// cache, 16 of them, and reads ahead those that are not, unless the mapping is marked
// random: so long as the cache holds the whole executable, each of the few thousand
// scattered pages a run reads of its read-only data and pclntab (the stack maps a
// garbage collection reads for every function on a stack, the types of the objects it
// marks) brought 64 KB with it, 12 of their 15 MB in all. Code is still read ahead: the
// kernel reads ahead for executable mappings whatever their advice.
func releaseOwnCode(exact bool) (int64, error) {
	if exact {
		// The kernel drops no dirty page from the cache: an executable written moments
		// ago (a build, a copy) is written out first, else its pages would all stay.
		if exe, err := os.Open("/proc/self/exe"); err == nil {
			unix.Fdatasync(int(exe.Fd())) // a read-only file system has nothing to write
			exe.Close()
		}
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return 0, fmt.Errorf("stat own executable: %w", err)
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var released int64
	var advise error
	err = procfs.ScanMaps(f, func(m procfs.Mapping) bool {
		// The executable's own read-only, private pages: its code and constants.
		if len(m.Perms) < 4 || m.Perms[1] == 'w' || m.Perms[3] != 'p' || m.Inode != st.Ino || m.Dev != st.Dev || m.End <= m.Start {
			return true
		}
		start, end := m.Start, m.End
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_DONTNEED); errno != 0 {
			advise = fmt.Errorf("release own pages at %#x: %w", start, errno)
			return false
		}
		if exact {
			if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_RANDOM); errno != 0 {
				advise = fmt.Errorf("advise random access to own pages at %#x: %w", start, errno)
				return false
			}
		}
		released += int64(end - start)
		return true
	})
	if err = errors.Join(advise, err); err != nil {
		return released, err
	}
	if exact {
		return released, dropOwnCache()
	}
	return released, nil
}

// dropOwnCache takes out of the page cache the pages of sonde's executable that no
// process maps: the kernel only evicts pages no one maps, so what a run uses stays.
// Pages read since the last drop without being mapped (by the symbolizer naming sonde's
// own frames, by read-ahead of code) would otherwise be mapped along with their
// neighbours' faults. Where the file system keeps files in memory (tmpfs) this does
// nothing and costs nothing.
func dropOwnCache() error {
	exe, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer exe.Close()
	if err := unix.Fadvise(int(exe.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("drop own executable's cached pages: %w", err)
	}
	return nil
}

// ownCacheEvery is how often the executable's pages read without being mapped leave the
// page cache. Each drop scans the file's cached pages in the kernel: at every 5 s
// interval that was a tenth of sonde's steady CPU beside the side-by-side workloads.
const ownCacheEvery = time.Minute

// ownReleases is how many intervals end with an exact release of sonde's own pages.
//
// The first release comes between the first naming and the first export, so that the
// export's code and data fault in on top of what the release leaves rather than of
// what the first naming touched (VmHWM, set in the first interval: 28.5–29.3 → 27.1–27.4
// MB beside the side-by-side workloads, three runs each).
//
// The second gives back what the first export used once: dialling the collector, gRPC's
// resolver, balancer and service config, the first HTTP/2 handshake. Those pages stayed
// resident for the whole run, 0.8 MB of code alone. Beside the side-by-side workloads
// and 120 execs a second (two sondes at once, 90 s, both orders), the mean RSS read
// 21.4 and 22.2 MB against 23.7 and 23.7 MB with one release (2026-11-29). A third, 30 s
// in, read 21.6/21.6 against 21.4/21.9 MB: nothing more to give back.
const ownReleases = 2

// ownPages schedules what the end of each interval gives back of sonde's executable.
type ownPages struct {
	intervals int
	dropped   time.Time
}

type ownPagesStep int

const (
	ownKeep      ownPagesStep = iota
	ownRelease                // releaseOwnCode(true): page-table entries and unmapped cache
	ownDropCache              // dropOwnCache: the cache alone
)

// intervalEnd says what to do at the end of an interval, at now. It is called once an
// interval is named and before it is exported.
func (o *ownPages) intervalEnd(now time.Time) ownPagesStep {
	o.intervals++
	switch {
	case o.intervals <= ownReleases:
		o.dropped = now
		return ownRelease
	case now.Sub(o.dropped) >= ownCacheEvery:
		o.dropped = now
		return ownDropCache
	}
	return ownKeep
}
