package debuginfod

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/retry"
)

// Kinds of failure, as Stats.Errors counts them.
const (
	ErrKindTimeout      = "timeout"        // no answer, or no progress, within Timeout or MaxTime
	ErrKindTooLarge     = "too_large"      // announced or sent more than MaxSize
	ErrKindWrongBuildID = "wrong_build_id" // an ELF file of another build
	ErrKindBadFile      = "bad_file"       // not ELF, or without symbols or DWARF
	ErrKindStatus       = "status"         // an HTTP status other than 200 and 404
	ErrKindNetwork      = "network"        // connection refused, reset, TLS...
	ErrKindCache        = "cache"          // the cache directory could not be written
)

// ErrorKinds lists the kinds of failure, for metrics that show each even at zero.
var ErrorKinds = []string{ErrKindTimeout, ErrKindTooLarge, ErrKindWrongBuildID, ErrKindBadFile, ErrKindStatus, ErrKindNetwork, ErrKindCache}

// Files kept per build ID, in the order they are asked for: the debug file, and the
// executable where a server has the unstripped program only.
const (
	kindDebuginfo  = "debuginfo"
	kindExecutable = "executable"
)

// Bounds of the client's memory, whatever the hosts and servers do.
const (
	maxQueued     = 1024  // fetches waiting for a worker; more are dropped and asked again later
	maxStates     = 16384 // build IDs remembered; past it failures are forgotten
	maxBuildIDLen = 128
)

// Stats count a Client's work over its lifetime.
type Stats struct {
	Fetches   int64 // HTTP requests sent
	NotFound  int64 // requests answered 404
	Downloads int64 // files verified and kept
	Bytes     int64 // bytes of the files kept
	Hits      int64 // build IDs found in the cache directory
	Misses    int64 // build IDs no server had (404 everywhere, or a stripped executable)
	Stripped  int64 // executables downloaded and found as stripped as the host's
	Dropped   int64 // fetches not queued because the queue was full
	Evicted   int64 // files removed to keep the cache within its bound
	InFlight  int64 // fetches running now
	// CacheBytes and CacheFiles are what the cache directory holds now.
	CacheBytes int64
	CacheFiles int64
	// Errors counts failed requests by kind (ErrKind*).
	Errors map[string]int64
}

type status uint8

const (
	statusQueued status = iota + 1
	statusPresent
	statusFailed
)

type state struct {
	status status
	path   string    // statusPresent
	until  time.Time // statusFailed: asked again after
}

// Client fetches debug files in the background; see the package's doc.
type Client struct {
	cfg   Config
	http  *http.Client
	queue chan string
	now   func() time.Time

	mu       sync.Mutex
	states   map[string]*state
	hostNext map[string]time.Time
	reported map[string]bool // server and kind of failure told to OnError
	// strippedIDs are build IDs whose executable a server had, without symbols.
	strippedIDs map[string]bool
	stats       Stats
	errs        map[string]int64
	// settled is closed, and replaced, whenever a fetch ends: Settle's wake-up.
	settled chan struct{}
}

// New checks cfg, creates the cache directory, removes what an earlier run left half
// written and brings the directory within its bound. It fetches nothing until Run.
func New(cfg Config) (*Client, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.CacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("debuginfod cache: %w", err)
	}
	tr := cfg.Transport
	if tr == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.ResponseHeaderTimeout = cfg.Timeout
		t.MaxIdleConnsPerHost = cfg.MaxInFlight
		tr = t
	}
	c := &Client{
		cfg: cfg,
		// Redirects are followed (servers federate), a few at most.
		http: &http.Client{Transport: tr, CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return errors.New("more than 5 redirects")
			}
			return nil
		}},
		queue:       make(chan string, maxQueued),
		now:         time.Now,
		states:      map[string]*state{},
		hostNext:    map[string]time.Time{},
		reported:    map[string]bool{},
		strippedIDs: map[string]bool{},
		errs:        map[string]int64{},
		settled:     make(chan struct{}),
	}
	if err := c.clean(); err != nil {
		return nil, err
	}
	return c, nil
}

// Run fetches what DebugFile queued until ctx ends, MaxInFlight at a time. Fetches under
// way when ctx ends are abandoned, their partial files removed.
func (c *Client) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range c.cfg.MaxInFlight {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case id := <-c.queue:
					c.fetch(ctx, id)
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// ValidBuildID reports whether id is a build ID as servers take them: lowercase hex.
func ValidBuildID(id string) bool {
	if len(id) < 2 || len(id) > maxBuildIDLen || len(id)%2 != 0 {
		return false
	}
	for _, r := range id {
		if !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') {
			return false
		}
	}
	return true
}

// DebugFile returns the path of the verified file holding buildID's debug information,
// or "" when there is none yet; then it queues a fetch, unless one is queued or under
// way or failed less than NegativeTTL ago. It never waits on the network.
func (c *Client) DebugFile(buildID string) string {
	if len(c.cfg.URLs) == 0 || !ValidBuildID(buildID) {
		return ""
	}
	c.mu.Lock()
	st := c.states[buildID]
	if st != nil {
		switch {
		case st.status == statusPresent:
			c.mu.Unlock()
			return st.path
		case st.status == statusQueued, c.now().Before(st.until):
			c.mu.Unlock()
			return ""
		}
	}
	c.mu.Unlock()
	// A file an earlier run fetched: its use makes it recent for the LRU.
	if st == nil {
		for _, kind := range []string{kindDebuginfo, kindExecutable} {
			p := filepath.Join(c.cfg.CacheDir, buildID, kind)
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
				now := c.now()
				os.Chtimes(p, now, now)
				c.mu.Lock()
				c.setState(buildID, &state{status: statusPresent, path: p})
				c.stats.Hits++
				c.mu.Unlock()
				return p
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.states[buildID]; st != nil && (st.status == statusPresent || st.status == statusQueued) {
		return st.path
	}
	select {
	case c.queue <- buildID:
		c.setState(buildID, &state{status: statusQueued})
	default:
		c.stats.Dropped++
	}
	return ""
}

// setState records a build ID's state, forgetting failures (and then everything but
// fetches under way) when too many are remembered. c.mu is held.
func (c *Client) setState(id string, st *state) {
	if _, ok := c.states[id]; !ok && len(c.states) >= maxStates {
		for k, s := range c.states {
			if s.status == statusFailed {
				delete(c.states, k)
			}
		}
		if len(c.states) >= maxStates {
			for k, s := range c.states {
				if s.status != statusQueued {
					delete(c.states, k)
				}
			}
		}
	}
	c.states[id] = st
}

// Stats returns the counts so far.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stats
	st.Errors = make(map[string]int64, len(c.errs))
	for k, v := range c.errs {
		st.Errors[k] = v
	}
	return st
}

// fetchError is a failed request, with its kind for Stats.
type fetchError struct {
	kind string
	host string
	err  error
}

func (e *fetchError) Error() string { return e.err.Error() }
func (e *fetchError) Unwrap() error { return e.err }

var (
	errNotFound = errors.New("not found")
	// errStripped: the server's executable is as stripped as the host's.
	errStripped = errors.New("stripped executable")
)

// fetch asks each server for buildID's debug file, then its executable, and keeps the
// first that verifies.
func (c *Client) fetch(ctx context.Context, id string) {
	c.mu.Lock()
	c.stats.InFlight++
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.stats.InFlight--
		c.mu.Unlock()
	}()
	failed := false
	for _, base := range c.cfg.URLs {
		for _, kind := range []string{kindDebuginfo, kindExecutable} {
			if ctx.Err() != nil {
				c.finish(id, "")
				return
			}
			if kind == kindExecutable && c.stripped(id, false) {
				continue
			}
			p, err := c.get(ctx, base, id, kind)
			if err == nil {
				c.finish(id, p)
				return
			}
			if errors.Is(err, errStripped) {
				// Not downloaded again while this agent runs: the debug file may come
				// to the server, a build's executable does not change.
				c.stripped(id, true)
				continue
			}
			if errors.Is(err, errNotFound) {
				continue
			}
			if ctx.Err() != nil { // shutdown, not the server's fault
				c.finish(id, "")
				return
			}
			failed = true
			c.failure(err)
			// A server that failed other than by not having the file is unwell or
			// lying: it is not asked for the other kind.
			break
		}
	}
	c.mu.Lock()
	if !failed {
		c.stats.Misses++
	}
	c.mu.Unlock()
	c.finish(id, "")
}

// stripped reports whether id's executable was found stripped, and remembers it if set.
func (c *Client) stripped(id string, set bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if set {
		if len(c.strippedIDs) >= maxStates {
			clear(c.strippedIDs)
		}
		c.strippedIDs[id] = true
		c.stats.Stripped++
	}
	return c.strippedIDs[id]
}

// Settle waits until no fetch is queued or under way, or ctx ends, and returns how many
// were left: a run that writes its profile once, at its end, names it again with what
// came. The continuous agent never waits: its next interval has what came.
func (c *Client) Settle(ctx context.Context) int {
	for {
		c.mu.Lock()
		n := c.pending()
		wake := c.settled
		c.mu.Unlock()
		if n == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return n
		case <-wake:
		}
	}
}

// Pending is how many fetches are queued or under way.
func (c *Client) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending()
}

func (c *Client) pending() int {
	n := 0
	for _, st := range c.states {
		if st.status == statusQueued {
			n++
		}
	}
	return n
}

// finish records the outcome of a fetch: a path, or a failure not retried for a while.
func (c *Client) finish(id, path string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer func() { close(c.settled); c.settled = make(chan struct{}) }()
	if path != "" {
		c.setState(id, &state{status: statusPresent, path: path})
		return
	}
	c.setState(id, &state{status: statusFailed, until: c.now().Add(c.cfg.NegativeTTL)})
}

// failure counts err and tells OnError the first time its server fails this way.
func (c *Client) failure(err error) {
	kind, host := ErrKindNetwork, ""
	if fe := (*fetchError)(nil); errors.As(err, &fe) {
		kind, host = fe.kind, fe.host
	}
	c.mu.Lock()
	c.errs[kind]++
	key := host + " " + kind
	first := !c.reported[key]
	c.reported[key] = true
	c.mu.Unlock()
	if first && c.cfg.OnError != nil {
		c.cfg.OnError(err)
	}
}

// wait holds a request to host until the host's interval since the last has passed.
func (c *Client) wait(ctx context.Context, host string) error {
	c.mu.Lock()
	now := c.now()
	at := now
	if next := c.hostNext[host]; next.After(now) {
		at = next
	}
	c.hostNext[host] = at.Add(c.cfg.HostInterval)
	if len(c.hostNext) > 64 { // servers come from the configuration: few
		for h, t := range c.hostNext {
			if t.Before(now) {
				delete(c.hostNext, h)
			}
		}
	}
	c.mu.Unlock()
	if d := at.Sub(now); d > 0 && !retry.Sleep(ctx, d) {
		return ctx.Err()
	}
	return nil
}

// get downloads one file into the cache and returns its path once verified.
func (c *Client) get(ctx context.Context, base, id, kind string) (string, error) {
	u, err := url.Parse(base + "/buildid/" + id + "/" + kind)
	if err != nil {
		return "", &fetchError{ErrKindNetwork, base, fmt.Errorf("debuginfod %s: %w", base, err)}
	}
	host := u.Host
	fail := func(kind string, format string, args ...any) error {
		return &fetchError{kind, host, fmt.Errorf("fetch %s %s from %s: %s", kind, id, host, fmt.Sprintf(format, args...))}
	}
	if err := c.wait(ctx, host); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.MaxTime)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", fail(ErrKindNetwork, "%v", err)
	}
	for k, v := range c.cfg.Headers {
		req.Header[k] = slices.Clone(v)
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "sonde")
	}
	// The transport's header timeout bounds the wait for an answer; this bounds it for
	// transports without one, and the wait for each part of the body below.
	stall := time.AfterFunc(c.cfg.Timeout, cancel)
	defer stall.Stop()
	c.mu.Lock()
	c.stats.Fetches++
	c.mu.Unlock()
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil || isTimeout(err) {
			return "", fail(ErrKindTimeout, "no answer: %v", err)
		}
		return "", fail(ErrKindNetwork, "%v", err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		c.mu.Lock()
		c.stats.NotFound++
		c.mu.Unlock()
		return "", errNotFound
	case resp.StatusCode != http.StatusOK:
		return "", fail(ErrKindStatus, "status %s", resp.Status)
	}
	size := resp.ContentLength
	if s, err := strconv.ParseInt(resp.Header.Get("X-Debuginfod-Size"), 10, 64); err == nil && s > size {
		size = s
	}
	if size > c.cfg.MaxSize {
		return "", fail(ErrKindTooLarge, "%d bytes, more than the %d allowed", size, c.cfg.MaxSize)
	}
	dir := filepath.Join(c.cfg.CacheDir, id)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fail(ErrKindCache, "%v", err)
	}
	tmp, err := os.CreateTemp(dir, ".part-*")
	if err != nil {
		return "", fail(ErrKindCache, "%v", err)
	}
	kept := false
	defer func() {
		if !kept {
			tmp.Close()
			os.Remove(tmp.Name())
			os.Remove(dir) // only if empty: a file of the other kind may be there
		}
	}()
	n, err := io.Copy(tmp, &progressReader{r: io.LimitReader(resp.Body, c.cfg.MaxSize+1), stall: stall, timeout: c.cfg.Timeout})
	switch {
	case n > c.cfg.MaxSize:
		return "", fail(ErrKindTooLarge, "more than the %d bytes allowed", c.cfg.MaxSize)
	case err != nil && (ctx.Err() != nil || isTimeout(err)):
		return "", fail(ErrKindTimeout, "after %d bytes: %v", n, err)
	case err != nil:
		return "", fail(ErrKindNetwork, "after %d bytes: %v", n, err)
	}
	if err := tmp.Close(); err != nil {
		return "", fail(ErrKindCache, "%v", err)
	}
	if err := verify(tmp.Name(), id); err != nil {
		if kind == kindExecutable && errors.Is(err, errNoSymbols) {
			return "", errStripped
		}
		k := ErrKindBadFile
		if errors.Is(err, errWrongBuildID) {
			k = ErrKindWrongBuildID
		}
		return "", fail(k, "%v", err)
	}
	final := filepath.Join(dir, kind)
	if err := os.Rename(tmp.Name(), final); err != nil {
		return "", fail(ErrKindCache, "%v", err)
	}
	kept = true
	c.mu.Lock()
	c.stats.Downloads++
	c.stats.Bytes += n
	c.stats.CacheBytes += n
	c.stats.CacheFiles++
	over := c.stats.CacheBytes > c.cfg.CacheBytes
	c.mu.Unlock()
	if over {
		c.evict(final)
	}
	return final, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// progressReader pushes the stall deadline back whenever bytes arrive.
type progressReader struct {
	r       io.Reader
	stall   *time.Timer
	timeout time.Duration
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.stall.Reset(p.timeout)
	}
	return n, err
}

var errWrongBuildID = errors.New("wrong build id")

// verify checks that the file at path is ELF, carries the GNU build ID id, and has
// something to name code with.
func verify(path, id string) error {
	h, err := objfile.OpenHost(path)
	if err != nil {
		return err
	}
	defer h.Close()
	f, err := h.ELF()
	if err != nil {
		return fmt.Errorf("not an ELF file: %w", err)
	}
	if got := objfile.GNUBuildID(f); got != id {
		if got == "" {
			got = "none"
		}
		return fmt.Errorf("%w: %s", errWrongBuildID, got)
	}
	for _, name := range []string{".symtab", ".debug_info", ".zdebug_info"} {
		if s := f.Section(name); s != nil && s.Type != elf.SHT_NOBITS && s.Size > 0 {
			return nil
		}
	}
	return errNoSymbols
}

// errNoSymbols: an ELF file of the right build but nothing to name code with, as the
// executable of a stripped program is.
var errNoSymbols = errors.New("no .symtab and no DWARF")

// cached is a file of the cache directory.
type cached struct {
	path string
	size int64
	used time.Time
}

// scan lists the cache directory's files, removing partial ones an earlier run left.
func (c *Client) scan() ([]cached, error) {
	dirs, err := os.ReadDir(c.cfg.CacheDir)
	if err != nil {
		return nil, fmt.Errorf("debuginfod cache: %w", err)
	}
	var files []cached
	for _, d := range dirs {
		if !d.IsDir() || !ValidBuildID(d.Name()) {
			continue
		}
		dir := filepath.Join(c.cfg.CacheDir, d.Name())
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			fi, err := e.Info()
			if err != nil || !fi.Mode().IsRegular() {
				continue
			}
			if strings.HasPrefix(e.Name(), ".part-") {
				// Another client may be writing it only if two agents share the
				// directory; one as old as this is abandoned.
				if c.now().Sub(fi.ModTime()) > time.Hour || c.now().Sub(fi.ModTime()) > 2*c.cfg.MaxTime {
					os.Remove(p)
				}
				continue
			}
			if e.Name() != kindDebuginfo && e.Name() != kindExecutable {
				continue
			}
			files = append(files, cached{path: p, size: fi.Size(), used: usedAt(fi)})
		}
		if len(entries) == 0 {
			os.Remove(dir)
		}
	}
	return files, nil
}

// clean totals the cache directory and brings it within its bound.
func (c *Client) clean() error {
	files, err := c.scan()
	if err != nil {
		return err
	}
	var total int64
	for _, f := range files {
		total += f.size
	}
	c.mu.Lock()
	c.stats.CacheBytes, c.stats.CacheFiles = total, int64(len(files))
	c.mu.Unlock()
	if total > c.cfg.CacheBytes {
		c.evict("")
	}
	return nil
}

// evict removes the least recently used files until the directory is within its bound,
// keeping keep, the file just fetched.
func (c *Client) evict(keep string) {
	files, err := c.scan()
	if err != nil {
		return
	}
	slices.SortFunc(files, func(a, b cached) int { return a.used.Compare(b.used) })
	var total int64
	for _, f := range files {
		total += f.size
	}
	n := int64(len(files))
	for _, f := range files {
		if total <= c.cfg.CacheBytes {
			break
		}
		if f.path == keep || os.Remove(f.path) != nil {
			continue
		}
		os.Remove(filepath.Dir(f.path)) // if empty
		total -= f.size
		n--
		id := filepath.Base(filepath.Dir(f.path))
		c.mu.Lock()
		if st := c.states[id]; st != nil && st.path == f.path {
			delete(c.states, id)
		}
		c.stats.Evicted++
		c.mu.Unlock()
	}
	c.mu.Lock()
	c.stats.CacheBytes, c.stats.CacheFiles = total, n
	c.mu.Unlock()
}

// usedAt is when a cached file was last used: DebugFile sets its modification time;
// its access time counts too where the file system keeps it.
func usedAt(fi os.FileInfo) time.Time {
	used := fi.ModTime()
	if a := accessTime(fi); a.After(used) {
		used = a
	}
	return used
}
