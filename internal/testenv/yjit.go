package testenv

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// No distribution's Ruby has YJIT here (Debian builds without rustc), so the tests build
// one as Ruby's own images do: Debian's source of the Ruby 3.3 in sid, configured with
// --enable-yjit, its miniruby alone (the VM with YJIT, without the extensions the workloads
// do not use). The tarball carries its generated sources: no host Ruby takes part.
const (
	yjitSuite  = "sid"
	yjitSource = "ruby3.3"
	// The release the tests were written against, and its tarball's SHA-256 as Debian's
	// Sources index gives it. Where the archive has moved on, the index names the newer.
	yjitPinned       = "ruby3.3_3.3.8.orig.tar.xz"
	yjitPinnedSHA256 = "e2e1233ad275b7623a05edf23a01192626d1da454bdfe353a28a87acd8ef015c"
	debianMirror     = "http://deb.debian.org/debian"
)

// YJITRuby is Ruby 3.3 built with YJIT (BuildYJITRuby), run with --yjit.
func YJITRuby(t testing.TB) Ruby {
	t.Helper()
	r := Ruby{Path: builtFromSource(t, "ruby with yjit", BuildYJITRuby), Flags: []string{"--yjit"}}
	r.Version = r.version(t)
	r.Name = r.Version + " (yjit)"
	return r
}

// BuildYJITRuby builds the Ruby YJITRuby runs, if no complete one is cached, and returns
// its path. logf hears what it does.
func BuildYJITRuby(logf func(format string, args ...any)) (string, error) {
	dir := filepath.Join(cacheDir("SONDE_YJIT_CACHE", "/var/tmp/sonde-yjit"), strings.TrimSuffix(yjitPinned, ".orig.tar.xz"))
	return filepath.Join(dir, "miniruby"), buildCached(dir, logf, func(tmp string) error {
		rustc, err := findRustc()
		if err != nil {
			return err
		}
		tarball, err := fetchYJITSource()
		if err != nil {
			return err
		}
		logf("building Ruby with YJIT from %s (%d bytes)", yjitPinned, len(tarball))
		env := append(os.Environ(), "PATH="+filepath.Dir(rustc)+":"+os.Getenv("PATH"))
		if err := buildSource(tmp, tarball, env,
			[]string{"./configure", "--enable-yjit", "--disable-install-doc", "--without-gmp", "--disable-rubygems", "--without-baseruby"},
			[]string{"make", "-j2", "miniruby"},
		); err != nil {
			return err
		}
		if out, err := exec.Command(filepath.Join(tmp, "miniruby"), "--yjit", "-e", "exit(RubyVM::YJIT.enabled? ? 0 : 1)").CombinedOutput(); err != nil {
			return fmt.Errorf("the Ruby built runs without YJIT: %v\n%s", err, out)
		}
		return nil
	})
}

// findRustc finds rustc, which YJIT is written for: on PATH, or where rustup puts it.
func findRustc() (string, error) {
	if p, err := exec.LookPath("rustc"); err == nil {
		return p, nil
	}
	home, _ := os.UserHomeDir()
	for _, p := range []string{filepath.Join(home, ".cargo/bin/rustc"), "/root/.cargo/bin/rustc", "/usr/local/cargo/bin/rustc"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no rustc, which YJIT needs")
}

// fetchYJITSource downloads Ruby's source from Debian's archive: the pinned release, or
// the one the suite's Sources index names where the archive no longer has it, checked
// against the SHA-256 the index (or the pin) gives.
func fetchYJITSource() ([]byte, error) {
	b, err := httpGet(debianMirror + "/pool/main/r/" + yjitSource + "/" + yjitPinned)
	if err == nil {
		return b, checkSHA256(b, yjitPinnedSHA256, yjitPinned)
	}
	index, ierr := httpGet(debianMirror + "/dists/" + yjitSuite + "/main/source/Sources.xz")
	if ierr != nil {
		return nil, fmt.Errorf("%s: %v; Sources: %v", yjitPinned, err, ierr)
	}
	unxz := exec.Command("xz", "-dc")
	unxz.Stdin = bytes.NewReader(index)
	sources, ierr := unxz.Output()
	if ierr != nil {
		return nil, fmt.Errorf("xz -dc Sources.xz: %w", ierr)
	}
	// The package's stanza: its directory, and the orig tarball's SHA-256 line.
	stanza := regexp.MustCompile(`(?s)\nPackage: ` + regexp.QuoteMeta(yjitSource) + `\n.*?\n\n`).Find(sources)
	m := regexp.MustCompile(`(?m)^ ([0-9a-f]{64}) \d+ (` + regexp.QuoteMeta(yjitSource) + `_[^ ]+\.orig\.tar\.xz)$`).FindSubmatch(stanza)
	if m == nil {
		return nil, fmt.Errorf("%s: %v, and %s's Sources has no %s tarball", yjitPinned, err, yjitSuite, yjitSource)
	}
	b, err = httpGet(debianMirror + "/pool/main/r/" + yjitSource + "/" + string(m[2]))
	if err != nil {
		return nil, err
	}
	return b, checkSHA256(b, string(m[1]), string(m[2]))
}

// builtFromSource returns the path build gives, building it if no complete build is
// cached: what no distribution packages (with gcc and make, which CI installs).
func builtFromSource(t testing.TB, what string, build func(logf func(format string, args ...any)) (string, error)) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		Unavailable(t, "building %s needs gcc", what)
	}
	path, err := build(func(format string, args ...any) { t.Logf(format, args...) })
	if err != nil {
		Unavailable(t, "%s: %v", what, err)
	}
	return path
}

// buildSource unpacks a source tarball (xz, one top directory) into dir and runs each
// command there in turn, with env (nil: this process's own).
func buildSource(dir string, tarball []byte, env []string, cmds ...[]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	untar := exec.Command("tar", "xJ", "--strip-components=1", "-C", dir)
	untar.Stdin = bytes.NewReader(tarball)
	if out, err := untar.CombinedOutput(); err != nil {
		return fmt.Errorf("untar: %v\n%s", err, out)
	}
	for _, args := range cmds {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v\n%s", strings.Join(args, " "), err, tail(out, 3000))
		}
	}
	return nil
}

func checkSHA256(b []byte, want, name string) error {
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != want {
		return fmt.Errorf("%s: SHA-256 %s, want %s", name, got, want)
	}
	return nil
}

func httpGet(url string) ([]byte, error) {
	c := http.Client{Timeout: 3 * time.Minute}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 64<<20))
}

// cacheDir is where a build from source is cached: the directory the environment variable
// env names, or fallback.
func cacheDir(env, fallback string) string {
	if d := os.Getenv(env); d != "" {
		return d
	}
	return fallback
}
