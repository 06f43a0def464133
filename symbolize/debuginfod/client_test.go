package debuginfod

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

const program = `
#include <stdio.h>
__attribute__((noinline)) int spin(int x) { for (int i = 0; i < 1000; i++) x = x * 3 + 1; return x; }
int main(int argc, char **argv) { printf("%d\n", spin(argc)); return 0; }
`

// debugFile builds program with -g and returns its debug file's bytes and build ID.
func debugFile(t testing.TB) ([]byte, string) {
	t.Helper()
	gcc := testenv.RequireTool(t, "gcc")
	objcopy := testenv.RequireTool(t, "objcopy")
	dir := t.TempDir()
	src, bin, dbg := filepath.Join(dir, "p.c"), filepath.Join(dir, "p"), filepath.Join(dir, "p.debug")
	if err := os.WriteFile(src, []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{{gcc, "-g", "-O1", "-Wl,--build-id", "-o", bin, src}, {objcopy, "--only-keep-debug", bin, dbg}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", cmd, err, out)
		}
	}
	data, err := os.ReadFile(dbg)
	if err != nil {
		t.Fatal(err)
	}
	return data, buildIDOf(t, data)
}

func buildIDOf(t testing.TB, data []byte) string {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	s := f.Section(".note.gnu.build-id")
	if s == nil {
		t.Fatal("no build id note")
	}
	// namesz, descsz, type, "GNU\0", then the ID.
	n := f.ByteOrder.Uint32(data[s.Offset+4:])
	return hex.EncodeToString(data[s.Offset+16 : s.Offset+16+uint64(n)])
}

// rebuilt returns a copy of a debug file carrying another build ID: as good as a
// different build for the client, without compiling one.
func rebuilt(t testing.TB, data []byte, seed byte) ([]byte, string) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	s := f.Section(".note.gnu.build-id")
	out := bytes.Clone(data)
	out[s.Offset+16] ^= seed
	out[s.Offset+17] ^= 0x5a
	return out, buildIDOf(t, out)
}

// server serves files by build ID and counts requests; other handlers replace it.
type server struct {
	*httptest.Server
	mu       sync.Mutex
	files    map[string][]byte // path → body
	requests atomic.Int64
	headers  http.Header // of the last request
}

func newServer(t testing.TB, handler http.HandlerFunc) *server {
	s := &server{files: map[string][]byte{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		s.mu.Lock()
		s.headers = r.Header.Clone()
		body, ok := s.files[r.URL.Path]
		s.mu.Unlock()
		if handler != nil {
			handler(w, r)
			return
		}
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) serve(id, kind string, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.files["/buildid/"+id+"/"+kind] = body
}

// started returns a running client and a function that stops it and waits for Run.
func started(t testing.TB, cfg Config) (*Client, func()) {
	t.Helper()
	if cfg.CacheDir == "" {
		cfg.CacheDir = t.TempDir()
	}
	if cfg.HostInterval == 0 {
		cfg.HostInterval = time.Millisecond
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		c.Run(ctx)
		close(done)
	}()
	stop := func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return within 30s of its context's end")
		}
	}
	t.Cleanup(stop)
	return c, stop
}

// waitFor polls until cond holds, failing the test after a generous deadline.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// settled waits until the client has no fetch queued or under way for id.
func settled(t testing.TB, c *Client, id string) {
	t.Helper()
	waitFor(t, "the fetch of "+id+" to end", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		st := c.states[id]
		return st != nil && st.status != statusQueued && c.stats.InFlight == 0
	})
}

// cacheFiles lists the files under dir, partial ones included.
func cacheFiles(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

func TestFetch(t *testing.T) {
	data, id := debugFile(t)
	srv := newServer(t, nil)
	srv.serve(id, "debuginfo", data)
	headers := filepath.Join(t.TempDir(), "headers")
	if err := os.WriteFile(headers, []byte("Authorization: Bearer s3cret\nnot a header\nX-Tenant:  a \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := ReadHeadersFile(headers)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, _ := started(t, Config{URLs: []string{srv.URL + "/"}, CacheDir: dir, Headers: h})
	if p := c.DebugFile(id); p != "" {
		t.Fatalf("DebugFile before any fetch = %q", p)
	}
	var path string
	waitFor(t, "the debug file", func() bool { path = c.DebugFile(id); return path != "" })
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, data) {
		t.Errorf("cached file: %d bytes, %v; want the %d served", len(got), err, len(data))
	}
	if want := filepath.Join(dir, id, "debuginfo"); path != want {
		t.Errorf("path %s, want %s", path, want)
	}
	srv.mu.Lock()
	if srv.headers.Get("Authorization") != "Bearer s3cret" || srv.headers.Get("X-Tenant") != "a" {
		t.Errorf("request headers %v, want those of the headers file", srv.headers)
	}
	srv.mu.Unlock()
	st := c.Stats()
	if st.Fetches != 1 || st.Downloads != 1 || st.Bytes != int64(len(data)) || st.CacheBytes != int64(len(data)) || st.CacheFiles != 1 || len(st.Errors) != 0 {
		t.Errorf("stats %+v", st)
	}
	if files := cacheFiles(t, dir); len(files) != 1 {
		t.Errorf("cache holds %v, want the one file", files)
	}
}

// A build ID no server has is asked once per server and kind, then not for a while.
func TestFetchNotFound(t *testing.T) {
	srv := newServer(t, nil)
	other := newServer(t, nil)
	c, _ := started(t, Config{URLs: []string{srv.URL, other.URL}})
	id := strings.Repeat("ab", 20)
	c.DebugFile(id)
	settled(t, c, id)
	if p := c.DebugFile(id); p != "" {
		t.Fatalf("DebugFile = %q", p)
	}
	st := c.Stats()
	if st.Misses != 1 || st.Fetches != 4 || st.NotFound != 4 || srv.requests.Load() != 2 || other.requests.Load() != 2 || len(st.Errors) != 0 {
		t.Errorf("stats %+v, requests %d and %d: want debuginfo and executable asked of each server once", st, srv.requests.Load(), other.requests.Load())
	}
	for i := 0; i < 10; i++ {
		c.DebugFile(id)
	}
	if st := c.Stats(); st.Fetches != 4 {
		t.Errorf("asked again within the negative TTL: %+v", st)
	}
	for _, bad := range []string{"", "a", "ABCD", "../etc", "abcg", strings.Repeat("a", 130)} {
		if c.DebugFile(bad) != "" {
			t.Errorf("DebugFile(%q) answered", bad)
		}
	}
	if st := c.Stats(); st.Fetches != 4 {
		t.Errorf("invalid build ids were fetched: %+v", st)
	}
}

// Where only an unstripped executable is on the server, it is what names.
func TestFetchExecutable(t *testing.T) {
	data, id := debugFile(t)
	srv := newServer(t, nil)
	srv.serve(id, "executable", data)
	c, _ := started(t, Config{URLs: []string{srv.URL}})
	var path string
	waitFor(t, "the executable", func() bool { path = c.DebugFile(id); return path != "" })
	if filepath.Base(path) != "executable" {
		t.Errorf("path %s", path)
	}
}

// Lying, slow and dead servers: each failure is counted by kind, reported once per
// server and kind, leaves nothing in the cache and does not hold the client up.
func TestFetchHostile(t *testing.T) {
	data, id := debugFile(t)
	other, otherID := rebuilt(t, data, 1)
	if otherID == id {
		t.Fatal("rebuilt kept the build id")
	}
	const maxSize = 4 << 20
	cases := []struct {
		name    string
		kind    string
		handler http.HandlerFunc
	}{
		{"another build's file", ErrKindWrongBuildID, func(w http.ResponseWriter, r *http.Request) { w.Write(other) }},
		{"garbage", ErrKindBadFile, func(w http.ResponseWriter, r *http.Request) {
			w.Write(bytes.Repeat([]byte("not an elf file "), 1000))
		}},
		{"truncated", ErrKindBadFile, func(w http.ResponseWriter, r *http.Request) { w.Write(data[:len(data)/2]) }},
		{"1 GiB announced", ErrKindTooLarge, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", fmt.Sprint(1<<30))
			w.WriteHeader(http.StatusOK)
			w.Write(make([]byte, 1<<16)) // then nothing: the client must not wait for the rest
		}},
		{"endless", ErrKindTooLarge, func(w http.ResponseWriter, r *http.Request) {
			zeros := make([]byte, 1<<16)
			for r.Context().Err() == nil {
				if _, err := w.Write(zeros); err != nil {
					return
				}
			}
		}},
		{"hanging", ErrKindTimeout, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }},
		{"stalling mid-body", ErrKindTimeout, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", fmt.Sprint(len(data)))
			w.Write(data[:100])
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}},
		{"killed mid-body", ErrKindNetwork, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", fmt.Sprint(len(data)))
			w.Write(data[:100])
			w.(http.Flusher).Flush()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}},
		{"500", ErrKindStatus, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", 500) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, tc.handler)
			var reports []error
			var mu sync.Mutex
			dir := t.TempDir()
			start := time.Now()
			c, stop := started(t, Config{URLs: []string{srv.URL}, CacheDir: dir, MaxSize: maxSize, Timeout: 300 * time.Millisecond,
				OnError: func(err error) { mu.Lock(); reports = append(reports, err); mu.Unlock() }})
			c.DebugFile(id)
			settled(t, c, id)
			_, id2 := rebuilt(t, data, 2)
			c.DebugFile(id2) // a second build ID: counted again, not reported again
			settled(t, c, id2)
			st := c.Stats()
			if st.Errors[tc.kind] != 2 || st.Downloads != 0 || len(st.Errors) != 1 {
				t.Errorf("stats %+v, want two errors of kind %s", st, tc.kind)
			}
			mu.Lock()
			if len(reports) != 1 || !strings.Contains(reports[0].Error(), id) {
				t.Errorf("reported %v, want one error naming %s", reports, id)
			}
			mu.Unlock()
			if c.DebugFile(id) != "" {
				t.Error("DebugFile answered after a failure")
			}
			if files := cacheFiles(t, dir); len(files) != 0 {
				t.Errorf("cache holds %v after failures", files)
			}
			stopped := time.Now()
			stop()
			if d := time.Since(stopped); d > 10*time.Second {
				t.Errorf("shutdown took %v", d)
			}
			t.Logf("%s: two fetches and shutdown in %v", tc.name, time.Since(start).Round(time.Millisecond))
		})
	}
}

// Shutdown does not wait for a server that never answers.
func TestShutdownWhileHanging(t *testing.T) {
	arrived := make(chan struct{}, 10)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done()
	})
	c, stop := started(t, Config{URLs: []string{srv.URL}, Timeout: time.Hour})
	c.DebugFile(strings.Repeat("cd", 20))
	<-arrived
	start := time.Now()
	stop()
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Run returned %v after its context ended", d)
	}
	if st := c.Stats(); st.InFlight != 0 || len(st.Errors) != 0 {
		t.Errorf("stats %+v: shutdown is not the server's failure", st)
	}
}

// The cache survives a restart and answers without a request; its bound in bytes
// holds, the least recently used files going first.
func TestCacheRestartAndBound(t *testing.T) {
	data, id := debugFile(t)
	srv := newServer(t, nil)
	srv.serve(id, "debuginfo", data)
	b, idB := rebuilt(t, data, 3)
	srv.serve(idB, "debuginfo", b)
	c3, idC := rebuilt(t, data, 4)
	srv.serve(idC, "debuginfo", c3)
	dir := t.TempDir()
	// Room for two files, not three.
	bound := int64(len(data))*2 + int64(len(data))/2
	cfg := Config{URLs: []string{srv.URL}, CacheDir: dir, CacheBytes: bound}
	c, stop := started(t, cfg)
	waitFor(t, "the first file", func() bool { return c.DebugFile(id) != "" })
	stop()
	if err := os.WriteFile(filepath.Join(dir, id, ".part-123"), []byte("left by a crash"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(filepath.Join(dir, id, ".part-123"), old, old)

	before := srv.requests.Load()
	c, _ = started(t, cfg)
	p := c.DebugFile(id)
	if p == "" || srv.requests.Load() != before {
		t.Fatalf("after a restart: %q, %d requests; want the cached file without one", p, srv.requests.Load()-before)
	}
	if st := c.Stats(); st.Hits != 1 || st.Fetches != 0 || st.CacheFiles != 1 {
		t.Errorf("stats %+v", st)
	}
	if _, err := os.Stat(filepath.Join(dir, id, ".part-123")); err == nil {
		t.Error("an old partial file was left")
	}
	// id was used just now; make it the oldest so that it goes first.
	os.Chtimes(p, old, old)
	waitFor(t, "the second file", func() bool { return c.DebugFile(idB) != "" })
	waitFor(t, "the third file", func() bool { return c.DebugFile(idC) != "" })
	var total int64
	for _, f := range cacheFiles(t, dir) {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		total += fi.Size()
	}
	st := c.Stats()
	if total > bound || st.CacheBytes != total || st.Evicted != 1 || st.CacheFiles != 2 {
		t.Errorf("cache %d bytes (stats %+v), bound %d: want one file evicted", total, st, bound)
	}
	if _, err := os.Stat(p); err == nil {
		t.Error("the least recently used file stayed")
	}
	// Evicted, it is fetched again when asked for.
	waitFor(t, "the evicted file again", func() bool { return c.DebugFile(id) != "" })
}

// Requests to one host are spaced by HostInterval; MaxInFlight bounds concurrency.
func TestRateLimit(t *testing.T) {
	var mu sync.Mutex
	var times []time.Time
	var running, peak atomic.Int64
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		http.NotFound(w, r)
	})
	const interval = 50 * time.Millisecond
	c, _ := started(t, Config{URLs: []string{srv.URL}, HostInterval: interval, MaxInFlight: 3})
	var ids []string
	start := time.Now()
	for i := range 5 {
		id := fmt.Sprintf("%040x", i+1)
		ids = append(ids, id)
		c.DebugFile(id)
	}
	for _, id := range ids {
		settled(t, c, id)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(times) != 10 {
		t.Fatalf("%d requests, want 10", len(times))
	}
	// Starts are spaced, arrivals may bunch up behind a slow one: the last cannot
	// arrive before nine intervals have passed since the first could start.
	last := times[0]
	for _, at := range times {
		if at.After(last) {
			last = at
		}
	}
	if d := last.Sub(start); d < 9*interval {
		t.Errorf("ten requests within %v, want them spaced by %v", d, interval)
	}
	if peak.Load() > 3 {
		t.Errorf("%d requests at once, want at most 3", peak.Load())
	}
}

func TestConfigFromEnv(t *testing.T) {
	headers := filepath.Join(t.TempDir(), "h")
	os.WriteFile(headers, []byte("Authorization: Basic x\n"), 0o600)
	env := map[string]string{
		"DEBUGINFOD_URLS":         " https://debuginfod.debian.net/  http://127.0.0.1:8002 ",
		"DEBUGINFOD_TIMEOUT":      "7",
		"DEBUGINFOD_MAXTIME":      "60",
		"DEBUGINFOD_MAXSIZE":      "1000000",
		"DEBUGINFOD_HEADERS_FILE": headers,
	}
	c, err := ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if len(c.URLs) != 2 || c.URLs[0] != "https://debuginfod.debian.net" || c.Timeout != 7*time.Second ||
		c.MaxTime != time.Minute || c.MaxSize != 1000000 || c.Headers.Get("Authorization") != "Basic x" {
		t.Errorf("config %+v", c)
	}
	for k, v := range map[string]string{"DEBUGINFOD_TIMEOUT": "soon", "DEBUGINFOD_MAXSIZE": "-1", "DEBUGINFOD_HEADERS_FILE": "/nonexistent"} {
		bad := map[string]string{k: v}
		if _, err := ConfigFromEnv(func(k string) string { return bad[k] }); err == nil {
			t.Errorf("%s=%s accepted", k, v)
		}
	}
	if _, err := New(Config{URLs: []string{"ftp://x"}, CacheDir: t.TempDir()}); err == nil {
		t.Error("an ftp URL was accepted")
	}
	if got := DefaultCacheDir(func(k string) string { return map[string]string{"STATE_DIRECTORY": "/var/lib/sonde:/x"}[k] }); got != "/var/lib/sonde/debuginfod" {
		t.Errorf("DefaultCacheDir under systemd = %s", got)
	}
	if got := DefaultCacheDir(func(k string) string {
		return map[string]string{"STATE_DIRECTORY": "/var/lib/sonde", "DEBUGINFOD_CACHE_PATH": "/c"}[k]
	}); got != "/c" {
		t.Errorf("DefaultCacheDir with DEBUGINFOD_CACHE_PATH = %s", got)
	}
}

// A download streams to disk: 64 MiB of body cost the client a small fraction of
// that in allocations, whatever the server sends.
func TestDownloadStreams(t *testing.T) {
	const size = 64 << 20
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		zeros := make([]byte, 1<<16)
		for range size / len(zeros) {
			if _, err := w.Write(zeros); err != nil {
				return
			}
		}
	})
	c, _ := started(t, Config{URLs: []string{srv.URL}, MaxSize: size - 1})
	id := strings.Repeat("ef", 20)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	c.DebugFile(id)
	settled(t, c, id)
	runtime.ReadMemStats(&after)
	if st := c.Stats(); st.Errors[ErrKindTooLarge] != 1 {
		t.Fatalf("stats %+v, want the body refused past MaxSize", st)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size/8 {
		t.Errorf("%d MiB allocated to stream %d MiB", alloc>>20, size>>20)
	} else {
		t.Logf("%d KiB allocated to stream %d MiB", alloc>>10, size>>20)
	}
}

// A server with the stripped executable only: a miss, not an error, and the executable
// is not downloaded again when the build ID is asked again.
func TestFetchStrippedExecutable(t *testing.T) {
	data, id := debugFile(t)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(testenv.RequireTool(t, "objcopy"), "--strip-all", in, out).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v\n%s", err, b)
	}
	stripped, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if buildIDOf(t, stripped) != id {
		t.Fatal("objcopy --strip-all dropped the build id")
	}
	srv := newServer(t, nil)
	srv.serve(id, "executable", stripped)
	var reports atomic.Int64
	cache := t.TempDir()
	c, _ := started(t, Config{URLs: []string{srv.URL}, CacheDir: cache, NegativeTTL: time.Millisecond, OnError: func(error) { reports.Add(1) }})
	c.DebugFile(id)
	settled(t, c, id)
	st := c.Stats()
	if st.Misses != 1 || st.Stripped != 1 || len(st.Errors) != 0 || reports.Load() != 0 || st.Fetches != 2 {
		t.Errorf("stats %+v, %d reports: want a miss, no error", st, reports.Load())
	}
	waitFor(t, "the negative entry to expire and a second fetch", func() bool {
		if c.Stats().Misses == 2 {
			return true
		}
		c.DebugFile(id)
		return false
	})
	settled(t, c, id)
	if st := c.Stats(); st.Fetches != 3 || st.Stripped != 1 {
		t.Errorf("stats %+v: want the debug file asked again, not the executable", st)
	}
	if files := cacheFiles(t, cache); len(files) != 0 {
		t.Errorf("cache holds %v", files)
	}
}

// Settle returns once the fetches asked for have ended, and when its context ends while a
// server hangs, with the count of those left.
func TestSettle(t *testing.T) {
	data, id := debugFile(t)
	srv := newServer(t, nil)
	srv.serve(id, "debuginfo", data)
	c, _ := started(t, Config{URLs: []string{srv.URL}})
	if n := c.Settle(context.Background()); n != 0 {
		t.Fatalf("Settle with nothing asked: %d left", n)
	}
	c.DebugFile(id)
	if n := c.Settle(context.Background()); n != 0 || c.DebugFile(id) == "" {
		t.Fatalf("Settle: %d left, file %q", n, c.DebugFile(id))
	}

	arrived := make(chan struct{}, 10)
	hanging := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done()
	})
	c, _ = started(t, Config{URLs: []string{hanging.URL}, Timeout: time.Hour})
	c.DebugFile(strings.Repeat("cd", 20))
	<-arrived
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if n := c.Settle(ctx); n != 1 || c.Pending() != 1 {
		t.Errorf("Settle against a hanging server: %d left, %d pending; want 1", n, c.Pending())
	}
}
