package main

import (
	"debug/elf"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
)

// spinStatic spends its time in a static function, which only .symtab or DWARF names:
// stripped, the program's frames are named by FDE (prog+0x1139).
const spinStatic = `#include <stdlib.h>
#include <time.h>
static volatile unsigned long acc;
__attribute__((noinline)) static void spin_static(void) { for (int i = 0; i < 1000000; i++) acc = acc * 31 + i; }
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){double end=now()+atof(argv[1]); while(now()<end) spin_static(); return 0;}
`

// strippedWorkload builds spinStatic with DWARF, puts its debug file in serveDir and
// strips the program to its build ID; it returns the program and the build ID.
func strippedWorkload(t *testing.T, serveDir string) (string, string) {
	t.Helper()
	objcopy := testenv.RequireTool(t, "objcopy")
	strip := testenv.RequireTool(t, "strip")
	full := buildWorkload(t, "spinstatic", spinStatic, "-g", "-O1", "-fno-omit-frame-pointer", "-Wl,--build-id")
	bin := full + ".stripped"
	for _, cmd := range [][]string{{objcopy, "--only-keep-debug", full, filepath.Join(serveDir, "spinstatic.debug")}, {strip, "-s", "-o", bin, full}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", cmd, err, out)
		}
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Section(".symtab") != nil || f.Section(".debug_info") != nil {
		t.Fatal("strip -s kept .symtab or DWARF")
	}
	id := objfile.GNUBuildID(f)
	if id == "" {
		t.Fatal("no build id")
	}
	return bin, id
}

// leafLines counts samples by their innermost user frame, as function and, when the
// frame has one, file:line.
func leafLines(p *profile.Profile) map[string]int64 {
	out := map[string]int64{}
	for _, s := range p.Sample {
		for _, l := range s.Location {
			if l.Mapping != nil && l.Mapping.File == "[kernel.kallsyms]" {
				continue
			}
			name := "(unnamed)"
			if len(l.Line) > 0 {
				ln := l.Line[0]
				name = ln.Function.Name
				if ln.Line > 0 {
					name += fmt.Sprintf(" %s:%d", filepath.Base(ln.Function.Filename), ln.Line)
				}
			}
			out[name] += s.Value[0]
			break
		}
	}
	return out
}

// waitMetric polls the agent's /metrics until name reaches at least want.
func waitMetric(t *testing.T, a *agent, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for a.metrics(t)[name] < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s stayed below %v for 2 minutes; stderr:\n%s", name, want, a.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A stripped program sampled by the real BPF sampler: its frames are named by FDE until
// sonde has fetched the debug file from elfutils' debuginfod, and then by function,
// file and line. Restarted with the server gone, sonde names them from its cache from
// the first interval on, without a request.
func TestEndToEndDebuginfod(t *testing.T) {
	testenv.RequireRoot(t)
	serve, cache := t.TempDir(), t.TempDir()
	bin, id := strippedWorkload(t, serve)
	url, kill := testenv.Debuginfod(t, serve, id)
	w := startWorkload(t, bin, 60)
	out := filepath.Join(t.TempDir(), "run.pb.gz")
	start := time.Now()
	a := startAgent(t, "--pid", strconv.Itoa(w.Process.Pid), "--frequency", "499", "--interval", "200ms",
		"--debuginfod-urls", url, "--debuginfod-cache-dir", cache, "--output", out)
	waitMetric(t, a, `sonde_debuginfod_lookups_total{outcome="downloaded"}`, 1)
	fetched := time.Since(start)
	// A thousand samples more: all but those of an interval or two under way when the
	// file came are named from it, the hot frames named by FDE before included.
	samples := a.metrics(t)["sonde_samples_total"]
	waitMetric(t, a, "sonde_samples_total", samples+1000)
	a.stop(t)
	leaves := leafLines(readProfile(t, out))
	var dwarf int64
	for name, n := range leaves {
		if strings.HasPrefix(name, "spin_static spinstatic.c:") {
			dwarf += n
		}
	}
	if dwarf < 500 {
		t.Fatalf("%d samples' leaves named spin_static at a line of spinstatic.c, want most of the 1000 taken after the fetch: %v", dwarf, leaves)
	}
	t.Logf("debug file fetched %v after sonde started; leaves %v", fetched.Round(time.Millisecond), leaves)

	// Restart without the server: every interval is named from the cache. (Files of
	// the host without local debug files, if any, are asked of the dead server.)
	kill()
	a = startAgent(t, "--pid", strconv.Itoa(w.Process.Pid), "--frequency", "499", "--interval", "200ms",
		"--debuginfod-urls", url, "--debuginfod-cache-dir", cache, "--output", out)
	waitMetric(t, a, `sonde_debuginfod_lookups_total{outcome="hit"}`, 1)
	waitMetric(t, a, "sonde_samples_total", 500)
	a.stop(t)
	leaves = leafLines(readProfile(t, out))
	for name, n := range leaves {
		if strings.Contains(name, "+0x") && strings.HasPrefix(name, filepath.Base(bin)) {
			t.Errorf("after a restart %d samples of %s: named by FDE, not from the cache; leaves %v", n, name, leaves)
		}
	}
}

// Lying, slow and dead servers cost sonde neither samples nor a prompt exit: a server
// that never answers, one that has nothing, one with another build's file and one
// sending 1 GiB. Each shows in /metrics.
// TestDebuginfodFirstShortRun: a run that writes its profile once, at its end (a 3-second
// --pid run), asks debuginfod for the stripped program's debug file when it names what it
// sampled, waits for it (bounded) and names the profile with it: the first run is named,
// not only the runs after it that find the file in the cache.
func TestDebuginfodFirstShortRun(t *testing.T) {
	testenv.RequireRoot(t)
	serve, cache := t.TempDir(), t.TempDir()
	bin, id := strippedWorkload(t, serve)
	url, _ := testenv.Debuginfod(t, serve, id)
	w := startWorkload(t, bin, 60)
	testenv.WaitCPU(t, w.Process.Pid, 200*time.Millisecond)
	out := filepath.Join(t.TempDir(), "run.pb.gz")
	_, stderr, err := runSonde(t, "--pid", strconv.Itoa(w.Process.Pid), "--duration", "3s", "--frequency", "499",
		"--debuginfod-urls", url, "--debuginfod-cache-dir", cache, "--output", out)
	if err != nil {
		t.Fatalf("sonde: %v\n%s", err, stderr)
	}
	leaves := leafLines(readProfile(t, out))
	var dwarf, all int64
	for name, n := range leaves {
		all += n
		if strings.HasPrefix(name, "spin_static spinstatic.c:") {
			dwarf += n
		}
	}
	t.Logf("leaves %v", leaves)
	if all < 100 || float64(dwarf) < 0.9*float64(all) {
		t.Errorf("%d of %d samples' leaves named spin_static at a line of spinstatic.c on the first run, want 0.9", dwarf, all)
	}
}

func TestEndToEndDebuginfodHostile(t *testing.T) {
	testenv.RequireRoot(t)
	serve := t.TempDir()
	bin, _ := strippedWorkload(t, serve)
	other := filepath.Join(serve, "spinstatic.debug")
	otherData, err := os.ReadFile(other)
	if err != nil {
		t.Fatal(err)
	}
	// Another build's file: the right one with its build ID changed.
	f, err := elf.Open(other)
	if err != nil {
		t.Fatal(err)
	}
	note := f.Section(".note.gnu.build-id")
	f.Close()
	otherData[note.Offset+16] ^= 0xff
	hang := make(chan struct{})
	servers := []http.HandlerFunc{
		func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-hang:
			}
		},
		http.NotFound,
		func(w http.ResponseWriter, r *http.Request) { w.Write(otherData) },
		func(w http.ResponseWriter, r *http.Request) {
			zeros := make([]byte, 1<<16)
			for range (1 << 30) / len(zeros) {
				if _, err := w.Write(zeros); err != nil {
					return
				}
			}
		},
	}
	var urls []string
	for _, h := range servers {
		s := httptest.NewServer(h)
		t.Cleanup(s.Close)
		urls = append(urls, s.URL)
	}
	t.Cleanup(func() { close(hang) })
	w := startWorkload(t, bin, 60)
	out := filepath.Join(t.TempDir(), "run.pb.gz")
	cmdEnv := []string{"DEBUGINFOD_TIMEOUT=1", "DEBUGINFOD_MAXSIZE=" + strconv.Itoa(64<<20)}
	cache := t.TempDir()
	a := startAgentEnv(t, cmdEnv, "--pid", strconv.Itoa(w.Process.Pid), "--frequency", "499", "--interval", "200ms",
		"--debuginfod-urls", strings.Join(urls, " "), "--debuginfod-cache-dir", cache, "--output", out)
	for _, r := range []string{"timeout", "wrong_build_id", "too_large"} {
		waitMetric(t, a, fmt.Sprintf(`sonde_debuginfod_errors_total{reason=%q}`, r), 1)
	}
	waitMetric(t, a, "sonde_debuginfod_not_found_total", 1)
	mt := a.metrics(t)
	samples := mt["sonde_samples_total"]
	waitMetric(t, a, "sonde_samples_total", samples+100)
	stopAt := time.Now()
	a.stop(t)
	if d := time.Since(stopAt); d > 10*time.Second {
		t.Errorf("sonde took %v to stop", d)
	}
	if n := strings.Count(a.stderr.String(), "debuginfod fetch failed"); n != 3 {
		t.Errorf("%d failures logged, want 3 (one per server and kind):\n%s", n, a.stderr.String())
	}
	leaves := leafLines(readProfile(t, out))
	for name := range leaves {
		if strings.HasPrefix(name, "spin_static spinstatic.c:") {
			t.Errorf("named from a hostile server's file: %v", leaves)
		}
	}
	var kept []string
	filepath.Walk(cache, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			kept = append(kept, p)
		}
		return nil
	})
	if len(kept) != 0 {
		t.Errorf("the cache holds %v after only failures", kept)
	}
}
