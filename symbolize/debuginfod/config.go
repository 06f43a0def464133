package debuginfod

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults for what Config leaves zero.
const (
	// DefaultTimeout is how long a server may take to start answering, and to send
	// more of a file: the elfutils client's default.
	DefaultTimeout = 90 * time.Second
	// DefaultMaxTime bounds one download, however slowly it trickles in.
	DefaultMaxTime = 10 * time.Minute
	// DefaultMaxSize bounds one file. Debug files of large C++ programs reach some
	// hundreds of MiB; the symbolizer reads at most 512 MiB of DWARF from one anyway.
	DefaultMaxSize = 512 << 20
	// DefaultCacheBytes bounds the directory of fetched files.
	DefaultCacheBytes = 2 << 30
	// DefaultNegativeTTL is how long a build ID no server had, or whose fetch failed,
	// is not asked for again: the elfutils client's cache_miss_s.
	DefaultNegativeTTL = 10 * time.Minute
	// DefaultMaxInFlight is how many fetches run at once: they wait on the network,
	// and a few keep a host's first minutes short without many connections.
	DefaultMaxInFlight = 2
	// DefaultHostInterval is the least time between two requests to one server.
	DefaultHostInterval = 100 * time.Millisecond
	// maxHeadersFileSize bounds DEBUGINFOD_HEADERS_FILE.
	maxHeadersFileSize = 64 << 10
)

// Config says which servers to ask and how. The zero value of a field means its default.
type Config struct {
	// URLs are the servers' base URLs, asked in order; none disables fetching.
	URLs []string
	// CacheDir is where fetched files are kept; it is created if missing.
	CacheDir string
	// CacheBytes bounds the files in CacheDir; the least recently used go first.
	CacheBytes int64
	// Timeout bounds the wait for a response's headers and for each read of its body.
	Timeout time.Duration
	// MaxTime bounds one download as a whole.
	MaxTime time.Duration
	// MaxSize bounds one file; larger ones are refused, by their announced size if
	// they announce one, else when the body passes it.
	MaxSize int64
	// NegativeTTL is how long a build ID that could not be fetched is not asked again.
	NegativeTTL time.Duration
	// Headers are added to every request (Authorization, for one).
	Headers http.Header
	// MaxInFlight bounds the fetches running at once.
	MaxInFlight int
	// HostInterval is the least time between the starts of two requests to one host.
	HostInterval time.Duration
	// Transport is what requests go through; nil means a clone of
	// http.DefaultTransport (the system's CA roots, HTTP_PROXY and the like).
	Transport http.RoundTripper
	// OnError, if set, is told of failures: once per server and kind of failure, so
	// that it can log what it is told. It is called from the fetching goroutines.
	OnError func(error)
}

// ConfigFromEnv reads the DEBUGINFOD_* variables through getenv. DEBUGINFOD_CACHE_PATH
// is left for the caller, which knows the default directory.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	c.URLs = ParseURLs(getenv("DEBUGINFOD_URLS"))
	seconds := func(name string) (time.Duration, error) {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return 0, nil
		}
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%s %q: want whole seconds", name, v)
		}
		return time.Duration(n) * time.Second, nil
	}
	var err error
	if c.Timeout, err = seconds("DEBUGINFOD_TIMEOUT"); err != nil {
		return c, err
	}
	if c.MaxTime, err = seconds("DEBUGINFOD_MAXTIME"); err != nil {
		return c, err
	}
	if v := strings.TrimSpace(getenv("DEBUGINFOD_MAXSIZE")); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return c, fmt.Errorf("DEBUGINFOD_MAXSIZE %q: want bytes", v)
		}
		c.MaxSize = n
	}
	if p := getenv("DEBUGINFOD_HEADERS_FILE"); p != "" {
		if c.Headers, err = ReadHeadersFile(p); err != nil {
			return c, err
		}
	}
	return c, nil
}

// ParseURLs splits DEBUGINFOD_URLS: URLs separated by spaces, trailing slashes dropped.
func ParseURLs(s string) []string {
	var urls []string
	for _, f := range strings.Fields(s) {
		urls = append(urls, strings.TrimRight(f, "/"))
	}
	return urls
}

// ReadHeadersFile reads DEBUGINFOD_HEADERS_FILE: one "Name: value" per line; blank
// lines and lines without a colon are ignored, as the elfutils client does.
func ReadHeadersFile(path string) (http.Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("DEBUGINFOD_HEADERS_FILE: %w", err)
	}
	defer f.Close()
	data := make([]byte, maxHeadersFileSize+1)
	n, err := f.Read(data)
	for err == nil && n < len(data) {
		var m int
		m, err = f.Read(data[n:])
		n += m
	}
	if n > maxHeadersFileSize {
		return nil, fmt.Errorf("DEBUGINFOD_HEADERS_FILE %s: larger than %d bytes", path, maxHeadersFileSize)
	}
	h := http.Header{}
	sc := bufio.NewScanner(bytes.NewReader(data[:n]))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" || strings.ContainsAny(name, " \t") || strings.ContainsAny(value, "\r\n") {
			continue
		}
		h.Add(textproto.CanonicalMIMEHeaderKey(name), value)
	}
	return h, nil
}

// CheckURLs refuses URLs that are not http or https, or name no host.
func CheckURLs(urls []string) error {
	for _, u := range urls {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("debuginfod url %q: want http:// or https:// and a host", u)
		}
	}
	return nil
}

// DefaultCacheDir is where fetched files go when DEBUGINFOD_CACHE_PATH does not say:
// under the state directory systemd gives the service (StateDirectory=, which the
// chart sets too), else under the user's cache directory.
func DefaultCacheDir(getenv func(string) string) string {
	if p := getenv("DEBUGINFOD_CACHE_PATH"); p != "" {
		return p
	}
	if d := getenv("STATE_DIRECTORY"); d != "" {
		// systemd may list several, separated by colons: the first is ours.
		d, _, _ = strings.Cut(d, ":")
		return filepath.Join(d, "debuginfod")
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "sonde", "debuginfod")
	}
	return filepath.Join(os.TempDir(), "sonde-debuginfod")
}

func (c *Config) check() error {
	c.URLs = slices.Clone(c.URLs)
	for i, u := range c.URLs {
		c.URLs[i] = strings.TrimRight(u, "/")
	}
	if err := CheckURLs(c.URLs); err != nil {
		return err
	}
	if c.CacheDir == "" {
		return errors.New("debuginfod: no cache directory")
	}
	if c.CacheBytes == 0 {
		c.CacheBytes = DefaultCacheBytes
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxTime == 0 {
		c.MaxTime = DefaultMaxTime
	}
	if c.MaxSize == 0 {
		c.MaxSize = DefaultMaxSize
	}
	// A file larger than the cache could never be kept.
	c.MaxSize = min(c.MaxSize, c.CacheBytes)
	if c.NegativeTTL == 0 {
		c.NegativeTTL = DefaultNegativeTTL
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.HostInterval == 0 {
		c.HostInterval = DefaultHostInterval
	}
	if c.CacheBytes < 0 || c.MaxSize < 0 || c.Timeout < 0 || c.MaxTime < 0 {
		return errors.New("debuginfod: negative bound")
	}
	return nil
}
