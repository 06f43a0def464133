package jvm

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/trace"
	"golang.org/x/sys/unix"
)

// execMappings reads a process's executable mappings as the agent gives them to a
// mapping observer: files reached through the process, anonymous code without a file.
func execMappings(t *testing.T, pid int) []*trace.Mapping {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d", pid)
	maps, err := os.ReadFile(dir + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	var out []*trace.Mapping
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || !strings.Contains(f[1], "x") {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		off, err3 := strconv.ParseUint(f[2], 16, 64)
		inode, err4 := strconv.ParseUint(f[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
			t.Fatalf("maps line %q", line)
		}
		m := &trace.Mapping{Start: start, End: end, Offset: off}
		if len(f) >= 6 {
			m.Path = strings.Join(f[5:], " ")
		}
		if inode != 0 {
			major, minor, _ := strings.Cut(f[3], ":")
			maj, _ := strconv.ParseUint(major, 16, 32)
			mnr, _ := strconv.ParseUint(minor, 16, 32)
			key := objfile.Key{Dev: unix.Mkdev(uint32(maj), uint32(mnr)), Inode: inode}
			m.File = objfile.NewFile(key, m.Path, objfile.Source{ProcDir: dir, Start: start, End: end, Path: m.Path})
		}
		out = append(out, m)
	}
	return out
}

// testTracker finds the chain's JVM among its mappings as the agent gives them and tells
// the kernel what its walker needs: the state the process's own tables give, for the
// exec it was read at; a process gone is deleted.
func testTracker(t *testing.T, jdk testenv.JDK, j *jvm) {
	k := newFakeKernel()
	var log errorLog
	tr := NewTracker(TrackerConfig{Kernel: k, OnError: log.add})
	pid := uint32(j.pid)
	mappings := execMappings(t, j.pid)
	if len(libJVMs(mappings)) != 1 {
		t.Fatalf("libjvm.so among the executable mappings: %d", len(libJVMs(mappings)))
	}
	tr.ProcessMappings(pid, 7, mappings)
	st, ok, sets, _ := k.state(pid)
	if !ok || sets != 1 {
		t.Fatalf("kernel not told: %+v, %v", tr.Stats(), log.get())
	}
	want, err := j.p.KernelState()
	if err != nil {
		t.Fatal(err)
	}
	if st.ExecID != 7 || st.CodeCache != want.CodeCache || st.Interpreter != want.Interpreter ||
		st.FPMethod != want.FPMethod || st.FPBCP != want.FPBCP || st.NMethodCompileID != want.NMethodCompileID ||
		st.NMethodMethod != want.NMethodMethod || len(st.Heaps) != len(want.Heaps) {
		t.Errorf("kernel told %+v, the process's tables say %+v", st, want)
	}
	if st.Interpreter[0] < st.CodeCache[0] || st.Interpreter[1] > st.CodeCache[1] || st.FPMethod >= 0 || st.ConstMethodSize == 0 {
		t.Errorf("implausible state %+v", st)
	}
	for i, h := range st.Heaps {
		if h.Low != want.Heaps[i].Low || h.Low < st.CodeCache[0] || h.High > st.CodeCache[1] || h.SegmapLow == 0 {
			t.Errorf("heap %d: %+v, want %+v", i, h, want.Heaps[i])
		}
	}
	if p := tr.Process(pid); p == nil || p.Bias() != j.p.Bias() || p.Version != jdk.Major {
		t.Errorf("process read %+v", p)
	}
	if s := tr.FinderStats(); s.FilesInspected != 1 || s.HotSpots != 1 || s.Attached != 1 {
		t.Errorf("finder %+v", s)
	}
	// Its mappings again: the tables are not read again.
	tr.ProcessMappings(pid, 7, execMappings(t, j.pid))
	if s := tr.FinderStats(); s.Attached != 1 {
		t.Errorf("tables read again: %+v", s)
	}
	tr.ProcessGone(pid)
	if _, ok, _, deleted := k.state(pid); ok || len(deleted) != 1 || deleted[0] != pid {
		t.Errorf("process gone: state %v, deleted %v", ok, deleted)
	}
	if s := tr.Stats(); s.Processes != 0 || s.Walked != 0 || s.GaveUp != 0 || s.KernelErrors != 0 {
		t.Errorf("tracker %+v", s)
	}
	if errs := log.get(); len(errs) != 0 {
		t.Errorf("OnError heard %v", errs)
	}
	t.Logf("JDK %s: kernel told %+v", jdk.Name, st)
}

// testRuntime names frames of the chain's nmethods and methods as the kernel encodes
// them, through SeenCode, the reader and Name, with no kernel: a call's return address by
// its PcDesc (the inlining chain at the call of chainSink), a pc just before it as a leaf
// (the same PcDesc, the next) and as a return address (none of its own: chainOuter
// alone), a frame of another compilation, a stub, interpreted frames and a Method* that
// is none.
func testRuntime(t *testing.T, jdk testenv.JDK, j *jvm, nm map[string]compiled) {
	k := newFakeKernel()
	r := New(Config{Kernel: k})
	pid := uint32(j.pid)
	r.ProcessMappings(pid, 1, execMappings(t, j.pid))
	if _, ok, _, _ := k.state(pid); !ok {
		t.Fatalf("kernel not told: %+v", r.tracker.Stats())
	}
	runNames(t, r)

	outer, sink := nm["chainOuter"], nm["chainSink"]
	d, err := j.p.ReadDebugInfo(outer.blob)
	if err != nil {
		t.Fatal(err)
	}
	// The call of chainSink: three scopes, chainLeaf's bci at its call; no PcDesc on
	// the byte before it.
	var call int32 = -1
	for i, pd := range d.PcDescs {
		if i == 0 || pd.ScopeOffset == 0 || d.PcDescs[i-1].PcOffset == pd.PcOffset-1 {
			continue
		}
		scopes, methods, err := j.p.ScopesAt(d, pd.PcOffset)
		if err != nil || len(scopes) != 3 {
			continue
		}
		if leaf, err := j.p.ReadMethod(methods[0]); err == nil && leaf.Name == "chainLeaf" {
			call = pd.PcOffset
			break
		}
	}
	if call < 0 {
		t.Fatalf("no PcDesc of chainOuter at the call of chainSink: %+v", d.PcDescs)
	}
	callPC := outer.blob.CodeBegin + uint64(call)
	tag := uint8(outer.blob.CompileID)
	var stub *Blob
	j.p.Blobs(func(b *Blob) bool {
		if !b.NMethod && b.CodeEnd > b.CodeBegin && b.Name != "" {
			stub = b
			return false
		}
		return true
	})
	if stub == nil {
		t.Fatal("no stub in the code cache")
	}
	chain := "SondeChain.chainLeaf|SondeChain.chainLeaf(J)J|SondeChain.java:30 < " +
		"SondeChain.chainMiddle|SondeChain.chainMiddle(JI)J|SondeChain.java:26 < " +
		"SondeChain.chainOuter|SondeChain.chainOuter(JI)J|SondeChain.java:20"
	cases := []struct {
		frame uint64
		want  string
	}{
		{EncodeCodeFrame(callPC, true, tag), chain},
		{EncodeCodeFrame(callPC-1, false, tag), chain},
		{EncodeCodeFrame(callPC-1, true, tag), "SondeChain.chainOuter|SondeChain.chainOuter(JI)J|SondeChain.java:0"},
		{EncodeCodeFrame(callPC, true, tag+1), JITPrefix + outer.blob.Name + "|" + JITPrefix + outer.blob.Name + "|:0"},
		{EncodeCodeFrame(sink.blob.CodeBegin, false, uint8(sink.blob.CompileID)), "SondeChain.chainSink|SondeChain.chainSink(J)J|SondeChain.java:"},
		{EncodeCodeFrame(stub.CodeBegin, false, 0), JITPrefix + stub.Name + "|" + JITPrefix + stub.Name + "|:0"},
		{EncodeInterpretedFrame(outer.mi.Method, 15), "SondeChain.chainOuter|SondeChain.chainOuter(JI)J|SondeChain.java:20"},
		{EncodeInterpretedFrame(outer.mi.Method, 26), "SondeChain.chainOuter|SondeChain.chainOuter(JI)J|SondeChain.java:22"},
		{EncodeInterpretedFrame(outer.mi.Method, BCIUnknown), "SondeChain.chainOuter|SondeChain.chainOuter(JI)J|SondeChain.java:0"},
		{EncodeInterpretedFrame(outer.mi.Method+8, 0), "[jit] interpreter|[jit] interpreter|:0"},
	}
	var frames []uint64
	for _, c := range cases {
		frames = append(frames, c.frame)
	}
	const image = 1
	start := time.Now()
	seeAll(t, r, pid, image, frames...)
	read := time.Since(start)
	for _, c := range cases {
		lines, ok := r.Name(location(r, pid, image, c.frame))
		// chainSink's first pc is before any line: its line is any of the method's.
		if got := linesString(lines); !ok || got != c.want && !(strings.HasSuffix(c.want, ":") && strings.HasPrefix(got, c.want)) {
			t.Errorf("frame %#x: %s; want %s", c.frame, got, c.want)
		}
	}
	s := r.NamesStats()
	if s.Read != 8 || s.Named != 7 || s.Recompiled != 1 || s.Stubs != 1 || s.Unnamed != 1 {
		t.Errorf("names %+v", s)
	}
	if ns := r.tracker.NamerStats(); ns.Recompiled != 1 || ns.Outermost != 1 {
		t.Errorf("namer %+v", ns)
	}
	t.Logf("JDK %s: %d frames read in %v; stub %q; %s", jdk.Name, len(cases), read.Round(time.Microsecond), stub.Name, logText(r))
}

// TestTrackerStartup: a JVM found while it starts (paused before it sets up its code
// cache) is not told to the kernel and is no error; read again of itself, without new
// mappings, once it runs, it is.
func TestTrackerStartup(t *testing.T) {
	for _, jdk := range testenv.JDKs {
		t.Run(fmt.Sprint(jdk.Major), func(t *testing.T) {
			testenv.RequireRoot(t)
			testenv.RequireJDK(t, jdk)
			dir := t.TempDir()
			if out, err := exec.Command(jdk.Javac(), "-g", "-d", dir, filepath.Join("testdata", "SondeChain.java")).CombinedOutput(); err != nil {
				t.Fatalf("javac: %v\n%s", err, out)
			}
			// The JVM makes the file when it pauses, and goes on once it is gone.
			pause := filepath.Join(dir, "pause")
			cmd := exec.Command(jdk.Java(), "-XX:+UnlockDiagnosticVMOptions", "-XX:+PauseAtStartup", "-XX:PauseAtStartupFile="+pause,
				"-XX:+UseSerialGC", "-Xmx64m", "-XX:-UsePerfData", "-cp", dir, "SondeChain")
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cmd.Process.Kill()
				cmd.Wait()
			})
			pid := cmd.Process.Pid
			testenv.WaitFor(t, "java to pause", testenv.StartTimeout, func() (bool, string) {
				_, err := os.Stat(pause)
				return err == nil, fmt.Sprint(err)
			})
			k := newFakeKernel()
			var log errorLog
			tr := NewTracker(TrackerConfig{Kernel: k, OnError: log.add})
			const calls = 3
			for range calls {
				tr.ProcessMappings(uint32(pid), 1, execMappings(t, pid))
			}
			s := tr.Stats()
			if _, ok, _, _ := k.state(uint32(pid)); ok || s.NotReady < calls || s.GaveUp != 0 {
				t.Errorf("paused JVM: told %v, %+v", ok, s)
			}
			ready := make(chan error, 1)
			go func() {
				line, err := bufio.NewReader(stdout).ReadString('\n')
				if err == nil && strings.TrimSpace(line) != "ready" {
					err = fmt.Errorf("java said %q", line)
				}
				ready <- err
				io.Copy(io.Discard, stdout)
			}()
			if err := os.Remove(pause); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-ready:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(testenv.StartTimeout):
				t.Fatalf("java did not start in %v", testenv.StartTimeout)
			}
			// No new mappings: the tracker reads the JVM again of itself.
			testenv.WaitFor(t, "the kernel told of the running JVM", testenv.StartTimeout, func() (bool, string) {
				st, ok, _, _ := k.state(uint32(pid))
				good := ok && st.ExecID == 1 && len(st.Heaps) > 0 && st.CodeCache[1] > st.CodeCache[0]
				return good, fmt.Sprintf("told %v %+v; %+v", ok, st, tr.Stats())
			})
			if errs := log.get(); len(errs) != 0 {
				t.Errorf("OnError heard %v", errs)
			}
			t.Logf("JDK %s: %+v", jdk.Name, tr.Stats())
		})
	}
}

// inotify watches files for opens.
type inotify struct {
	fd  int
	wds map[int32]string
}

func newInotify(t *testing.T, paths ...string) *inotify {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	in := &inotify{fd: fd, wds: map[int32]string{}}
	for _, p := range paths {
		wd, err := unix.InotifyAddWatch(fd, p, unix.IN_OPEN|unix.IN_ACCESS)
		if err != nil {
			t.Fatal(err)
		}
		in.wds[int32(wd)] = p
	}
	return in
}

// opened returns the files opened or read since the last call: the events are queued by
// the time the open returns.
func (in *inotify) opened() []string {
	var out []string
	buf := make([]byte, 4096)
	for {
		n, err := unix.Read(in.fd, buf)
		if err != nil || n <= 0 {
			return out
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			out = append(out, in.wds[ev.Wd])
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

// TestTrackerNoJVM: a process that maps no libjvm.so has no file of it opened and is not
// tracked; a file named libjvm.so that is not HotSpot is opened once, and not worth a word.
func TestTrackerNoJVM(t *testing.T) {
	dir := t.TempDir()
	exe, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libfoo.so")
	jvmDir := filepath.Join(dir, "server")
	fake := filepath.Join(jvmDir, "libjvm.so")
	if err := os.Mkdir(jvmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{lib, fake} {
		if err := os.WriteFile(p, exe, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mapping := func(path string) *trace.Mapping {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		f := objfile.NewFile(objfile.Key{Dev: st.Dev, Inode: st.Ino}, path, objfile.Source{Path: path})
		return &trace.Mapping{Start: 0x7f0000001000, End: 0x7f0000002000, Offset: 0x1000, Path: path, File: f}
	}
	in := newInotify(t, lib, fake)
	// The control: the watch sees an open.
	if f, err := os.Open(lib); err == nil {
		f.Close()
	}
	if got := in.opened(); len(got) == 0 {
		t.Fatal("inotify saw no open of the file opened")
	}
	k := newFakeKernel()
	var log errorLog
	tr := NewTracker(TrackerConfig{Kernel: k, OnError: log.add})
	pid := uint32(os.Getpid())
	anon := &trace.Mapping{Start: 0x7f0000100000, End: 0x7f0000200000}
	for range 2 {
		tr.ProcessMappings(pid, 1, []*trace.Mapping{mapping(lib), anon})
	}
	if got := in.opened(); len(got) != 0 {
		t.Errorf("a process without libjvm.so: opened %v", got)
	}
	if s, fs := tr.Stats(), tr.FinderStats(); s != (TrackerStats{}) || fs != (FinderStats{}) {
		t.Errorf("a process without libjvm.so: %+v, %+v", s, fs)
	}
	for range 2 {
		tr.ProcessMappings(pid, 1, []*trace.Mapping{mapping(fake), anon})
	}
	if got := in.opened(); len(got) == 0 || got[0] != fake {
		t.Errorf("a libjvm.so: opened %v", got)
	}
	if fs := tr.FinderStats(); fs.FilesInspected != 1 || fs.HotSpots != 0 || fs.Unsupported != 0 {
		t.Errorf("a libjvm.so that is not HotSpot: %+v", fs)
	}
	if _, ok, sets, _ := k.state(pid); ok || sets != 0 {
		t.Error("kernel told of a process without HotSpot")
	}
	// Another process mapping it: not opened again.
	tr.ProcessMappings(pid+1, 1, []*trace.Mapping{mapping(fake)})
	if got := in.opened(); len(got) != 0 {
		t.Errorf("a libjvm.so known not to be HotSpot: opened %v", got)
	}
	if errs := log.get(); len(errs) != 0 {
		t.Errorf("OnError heard %v", errs)
	}
}
