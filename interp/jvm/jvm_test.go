package jvm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/trace"
)

// jvm is a running SondeChain (testdata/SondeChain.java) and sonde's view of it.
type jvm struct {
	pid int
	p   *Process
}

// startChain compiles SondeChain with jdk's javac and runs it, keeping chainOuter and
// chainSink out of their callers so that each is an nmethod of its own.
func startChain(t *testing.T, jdk testenv.JDK, flags ...string) *jvm {
	t.Helper()
	// sonde reads other processes as root, and TestInterpreterFrame stops a JVM's threads
	// with ptrace: the tests run as sonde does.
	testenv.RequireRoot(t)
	testenv.RequireJDK(t, jdk)
	dir := t.TempDir()
	if out, err := exec.Command(jdk.Javac(), "-g", "-d", dir, filepath.Join("testdata", "SondeChain.java")).CombinedOutput(); err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}
	args := append([]string{"-XX:+UseSerialGC", "-Xmx64m", "-XX:-UsePerfData", "-XX:CompileCommand=quiet",
		"-XX:CompileCommand=dontinline,SondeChain::chainOuter", "-XX:CompileCommand=dontinline,SondeChain::chainSink"},
		flags...)
	args = append(args, "-cp", dir, "SondeChain")
	cmd := exec.Command(jdk.Java(), args...)
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
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("java said %q", line)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("java: %v", err)
		}
	case <-time.After(testenv.StartTimeout):
		t.Fatalf("java did not start in %v", testenv.StartTimeout)
	}
	start := time.Now()
	p, err := Attach(uint32(cmd.Process.Pid))
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	t.Logf("JDK %s: attached in %v: %d types with %d fields, %d int and %d long constants", jdk.Name,
		time.Since(start).Round(100*time.Microsecond), len(p.VM.Types), countFields(p.VM), len(p.VM.IntConstants), len(p.VM.LongConstants))
	return &jvm{pid: cmd.Process.Pid, p: p}
}

func countFields(vs *VMStructs) int {
	n := 0
	for _, fs := range vs.Fields {
		n += len(fs)
	}
	return n
}

// compiled is an nmethod of the test's class, found in the code cache.
type compiled struct {
	blob *Blob
	mi   *MethodInfo
}

// waitCompiled waits until C2 (tier 4) has compiled each of the methods named, as a
// method's entry rather than on stack replacement, and returns their nmethods.
func (j *jvm) waitCompiled(t *testing.T, names ...string) map[string]compiled {
	t.Helper()
	var found map[string]compiled
	testenv.WaitFor(t, "C2 to compile "+strings.Join(names, ", "), testenv.StartTimeout, func() (bool, string) {
		found = map[string]compiled{}
		var seen []string
		_, err := j.p.Blobs(func(b *Blob) bool {
			if !b.NMethod {
				return true
			}
			mi, err := j.p.ReadMethod(b.Method)
			if err != nil || mi.Class != "SondeChain" {
				return true
			}
			seen = append(seen, fmt.Sprintf("%s@%d/%d", mi.Name, b.CompLevel, b.EntryBCI))
			if b.CompLevel == 4 && int64(b.EntryBCI) == j.p.Layout.InvocationEntryBCI {
				found[mi.Name] = compiled{b, mi}
			}
			return true
		})
		for _, n := range names {
			if _, ok := found[n]; !ok {
				return false, fmt.Sprintf("nmethods %v (err %v)", seen, err)
			}
		}
		return true, ""
	})
	return found
}

// TestChain runs SondeChain once on each JDK, waits until C2 has compiled its chain, and
// checks what sonde reads of it: one JVM for all, run one after the other.
func TestChain(t *testing.T) {
	for _, jdk := range testenv.JDKs {
		t.Run(fmt.Sprint(jdk.Major), func(t *testing.T) {
			j := startChain(t, jdk)
			start := time.Now()
			nm := j.waitCompiled(t, "chainOuter", "chainSink")
			t.Logf("JDK %s: C2 compiled the chain %v after attaching", jdk.Name, time.Since(start).Round(time.Millisecond))
			t.Run("CodeCache", func(t *testing.T) { testCodeCache(t, jdk, j, nm) })
			t.Run("NameCompiled", func(t *testing.T) { testNameCompiled(t, jdk, j, nm) })
			t.Run("NameInterpreted", func(t *testing.T) { testNameInterpreted(t, jdk, j, nm) })
			t.Run("MissingField", func(t *testing.T) { testMissingField(t, jdk, j) })
			t.Run("FindAndKernelState", func(t *testing.T) { testFindAndKernelState(t, jdk, j) })
			t.Run("Tracker", func(t *testing.T) { testTracker(t, jdk, j) })
			t.Run("Runtime", func(t *testing.T) { testRuntime(t, jdk, j, nm) })
		})
	}
}

// testCodeCache finds the chain's nmethods in the code cache with their methods' names,
// signatures, source file and line tables.
func testCodeCache(t *testing.T, jdk testenv.JDK, j *jvm, nm map[string]compiled) {
	if j.p.Version != jdk.Major {
		t.Errorf("version %d, want %d", j.p.Version, jdk.Major)
	}
	want := byte(0)
	if jdk.Major >= 20 {
		want = 1
	}
	if j.p.StreamExcluded() != want {
		t.Errorf("UNSIGNED5 excludes %d bytes, want %d", j.p.StreamExcluded(), want)
	}
	low, high, err := j.p.Bounds()
	if err != nil {
		t.Fatal(err)
	}
	sigs := map[string]string{"chainOuter": "(JI)J", "chainSink": "(J)J"}
	for name, sig := range sigs {
		c := nm[name]
		if c.mi.Class != "SondeChain" || c.mi.Signature != sig || c.mi.File != "SondeChain.java" {
			t.Errorf("%s: class %q signature %q file %q", name, c.mi.Class, c.mi.Signature, c.mi.File)
		}
		if c.blob.Addr < low || c.blob.End > high {
			t.Errorf("%s at [%#x, %#x): outside the code cache [%#x, %#x)", name, c.blob.Addr, c.blob.End, low, high)
		}
	}
	// chainOuter's line table, as javac -g writes it for the source's lines.
	outer := nm["chainOuter"].mi
	for bci, line := range map[int32]int32{0: 18, 2: 19, 11: 20, 26: 22} {
		if got := outer.Line(bci); got != line {
			t.Errorf("chainOuter bci %d: line %d, want %d (table %v)", bci, got, line, outer.Lines)
		}
	}
}

// testNameCompiled names pcs of the chain's nmethods, of a stub and of no code.
func testNameCompiled(t *testing.T, jdk testenv.JDK, j *jvm, nm map[string]compiled) {
	n := NewNamer(j.p, NamerConfig{})

	// At the call of chainSink inside chainOuter's code, three frames: the leaf
	// and middle inlined, each its own frame.
	outer := nm["chainOuter"].blob
	d, err := j.p.ReadDebugInfo(outer)
	if err != nil {
		t.Fatal(err)
	}
	wantChain := []Frame{
		{Function: "SondeChain.chainLeaf", Signature: "(J)J", Line: 30, Inlined: true},
		{Function: "SondeChain.chainMiddle", Signature: "(JI)J", Line: 26, Inlined: true},
		{Function: "SondeChain.chainOuter", Signature: "(JI)J", Line: 20},
	}
	var chains []string
	matched := 0
	start := time.Now()
	named := 0
	for _, pd := range d.PcDescs {
		if pd.PcOffset < 0 || pd.ScopeOffset == 0 {
			continue
		}
		pc := outer.CodeBegin + uint64(pd.PcOffset)
		frames, err := n.Compiled(pc)
		named++
		if err != nil {
			t.Errorf("pc %#x: %v", pc, err)
			continue
		}
		var s []string
		for _, f := range frames {
			s = append(s, fmt.Sprintf("%s:%d", f.Name, f.Line))
			if f.Class != "SondeChain" || f.File != "SondeChain.java" || f.Line < 11 || f.Line > 35 {
				t.Errorf("pc %#x: implausible frame %+v", pc, f)
			}
		}
		chains = append(chains, strings.Join(s, " < "))
		if last := frames[len(frames)-1]; last.Name != "chainOuter" || last.Inlined {
			t.Errorf("pc %#x: outermost frame %+v, want chainOuter's own", pc, last)
		}
		if len(frames) != len(wantChain) {
			continue
		}
		ok := true
		for i, f := range frames {
			w := wantChain[i]
			if f.Function != w.Function || f.Signature != w.Signature || f.Line != w.Line || f.Inlined != w.Inlined {
				ok = false
			}
		}
		if ok {
			matched++
		}
	}
	t.Logf("JDK %s: chainOuter's scopes: %s (%d pcs named in %v)", jdk.Name, strings.Join(chains, "; "), named,
		time.Since(start).Round(time.Microsecond))
	if matched == 0 {
		t.Errorf("no pc of chainOuter names %v", wantChain)
	}

	// Any pc of chainSink's code, its own method.
	sink := nm["chainSink"].blob
	for _, pc := range []uint64{sink.CodeBegin, (sink.CodeBegin + sink.CodeEnd) / 2} {
		frames, err := n.Compiled(pc)
		if err != nil || len(frames) != 1 || frames[0].Function != "SondeChain.chainSink" || frames[0].Signature != "(J)J" {
			t.Errorf("chainSink's pc %#x: %+v, %v", pc, frames, err)
		}
	}

	// Named again and again from the cache: what it costs (reads of the segment
	// map, the blob's header and name, and each method's ConstMethod to check it).
	var call uint64
	for _, pd := range d.PcDescs {
		if pd.ScopeOffset != 0 && pd.PcOffset >= 0 {
			call = outer.CodeBegin + uint64(pd.PcOffset)
		}
	}
	const rounds = 1000
	start = time.Now()
	for range rounds {
		n.Compiled(call)
	}
	t.Logf("JDK %s: a pc of 3 frames named from the cache in %v", jdk.Name, (time.Since(start) / rounds).Round(100*time.Nanosecond))

	// Named again from the cache, the same.
	before := n.Stats()
	if before.Entries == 0 || before.Bytes == 0 {
		t.Errorf("nothing cached: %+v", before)
	}
	again, err := n.Compiled(sink.CodeBegin)
	if err != nil || again[0].Function != "SondeChain.chainSink" {
		t.Errorf("named again: %+v, %v", again, err)
	}
	if after := n.Stats(); after.Stale != 0 || after.Entries != before.Entries {
		t.Errorf("cache changed naming the same pc again: %+v then %+v", before, after)
	}

	// A cache too small to hold anything still names.
	tiny := NewNamer(j.p, NamerConfig{MaxBytes: 1})
	if frames, err := tiny.Compiled(sink.CodeBegin); err != nil || frames[0].Function != "SondeChain.chainSink" {
		t.Errorf("tiny cache: %+v, %v", frames, err)
	}
	if s := tiny.Stats(); s.Entries != 0 || s.Bytes != 0 {
		t.Errorf("tiny cache holds %+v", s)
	}

	// Code the JVM generated itself is named by its blob.
	var stub *Blob
	j.p.Blobs(func(b *Blob) bool {
		if !b.NMethod && b.CodeEnd > b.CodeBegin {
			stub = b
			return false
		}
		return true
	})
	if stub == nil {
		t.Fatal("no code blob but nmethods")
	}
	if frames, err := n.Compiled(stub.CodeBegin); err != nil || frames[0].Function != JITPrefix+stub.Name {
		t.Errorf("stub %q: %+v, %v", stub.Name, frames, err)
	}
	// Outside the code cache: unnamed, and the error says so.
	frames, err := n.Compiled(0x1000)
	if err == nil || frames[0].Function != JITPrefix+"unknown" {
		t.Errorf("pc 0x1000: %+v, %v", frames, err)
	}
	s := n.Stats()
	t.Logf("JDK %s: namer %+v", jdk.Name, s)
	if s.Unnamed != 1 || s.Stubs != 1 || s.Compiled == 0 {
		t.Errorf("counts %+v", s)
	}
}

// testNameInterpreted names frames from a Method* and a bytecode pointer or bci.
func testNameInterpreted(t *testing.T, jdk testenv.JDK, j *jvm, nm map[string]compiled) {
	n := NewNamer(j.p, NamerConfig{})
	outer := nm["chainOuter"].mi
	// An interpreter frame keeps its Method* and a pointer into the bytecodes,
	// which follow the ConstMethod: bci 15 is the call of chainMiddle, line 20.
	bcp := outer.ConstMethod + j.p.Layout.ConstMethodSize + 15
	f, err := n.Interpreted(outer.Method, bcp)
	if err != nil || f.Function != "SondeChain.chainOuter" || f.BCI != 15 || f.Line != 20 || f.File != "SondeChain.java" {
		t.Errorf("interpreted at bci 15: %+v, %v", f, err)
	}
	f, err = n.InterpretedBCI(outer.Method, 26)
	if err != nil || f.Line != 22 {
		t.Errorf("interpreted at bci 26: %+v, %v", f, err)
	}
	// A bcp outside the method: named, without a line.
	f, err = n.Interpreted(outer.Method, bcp+1<<20)
	if err != nil || f.Function != "SondeChain.chainOuter" || f.Line != -1 {
		t.Errorf("bcp outside: %+v, %v", f, err)
	}
	// What is not a Method is refused, not named.
	for _, bogus := range []uint64{0, outer.ConstMethod, nm["chainOuter"].blob.Addr, outer.Method + 8} {
		if f, err := n.Interpreted(bogus, bcp); err == nil || f.Method != 0 || !strings.HasPrefix(f.Function, JITPrefix) {
			t.Errorf("method %#x: %+v, %v", bogus, f, err)
		}
	}
}

// testMissingField: a build whose tables lack a field naming reads is refused with the
// field's name, never read with an offset from elsewhere.
func testMissingField(t *testing.T, jdk testenv.JDK, j *jvm) {
	vs := *j.p.VM
	vs.Fields = map[string]map[string]Field{}
	for typ, fs := range j.p.VM.Fields {
		vs.Fields[typ] = fs
	}
	blob := map[string]Field{}
	for k, v := range vs.Fields["CodeBlob"] {
		if k != "_name" {
			blob[k] = v
		}
	}
	vs.Fields["CodeBlob"] = blob
	delete(vs.Fields, "Symbol")
	_, err := NewLayout(&vs)
	if !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), "CodeBlob::_name") || !strings.Contains(err.Error(), "Symbol::_length") {
		t.Errorf("layout without CodeBlob::_name and Symbol: %v", err)
	}
	l := j.p.Layout
	t.Logf("JDK %s: interpreter frame %+v; code begin a pointer: %v; blob kind: %v; nmethod debug info in immutable data: %v",
		jdk.Name, l.Frame, l.CodeBeginIsPointer, l.HasBlobKind, l.NMethodImmutable)
}

// testFindAndKernelState finds HotSpot among a process's mappings as the agent gives them
// (inspecting libjvm.so once, whatever else is mapped), and reads what a kernel walker
// needs of it.
func testFindAndKernelState(t *testing.T, jdk testenv.JDK, j *jvm) {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", j.pid))
	if err != nil {
		t.Fatal(err)
	}
	m, ok := FindLibJVM(maps)
	if !ok {
		t.Fatal("no libjvm.so in maps")
	}
	dir := fmt.Sprintf("/proc/%d", j.pid)
	file := objfile.NewFile(m.Key, m.Path, objfile.Source{ProcDir: dir, Start: m.Start, End: m.End, Path: m.Path})
	java := objfile.NewFile(objfile.Key{Dev: 1, Inode: 1}, jdk.Java(), objfile.Source{Path: jdk.Java()})
	mappings := []*trace.Mapping{
		{Start: 0x1000, End: 0x2000, Path: jdk.Java(), File: java},
		{Start: m.Start, End: m.End, Offset: m.Offset, Path: m.Path, File: file},
	}
	f := NewFinder(0)
	for range 2 {
		p, err := f.Find(uint32(j.pid), mappings)
		if err != nil || p == nil || p.Version != jdk.Major || p.Bias() != j.p.Bias() {
			t.Fatalf("find: %+v, %v", p, err)
		}
	}
	if p, err := f.Find(uint32(j.pid), mappings[:1]); p != nil || err != nil {
		t.Errorf("a process without libjvm: %+v, %v", p, err)
	}
	if s := f.Stats(); s.FilesInspected != 1 || s.HotSpots != 1 || s.Attached != 2 || s.AttachErrors != 0 {
		t.Errorf("finder %+v", s)
	}

	ks, err := j.p.KernelState()
	if err != nil {
		t.Fatal(err)
	}
	if len(ks.Heaps) == 0 || ks.FPMethod != -24 || ks.FPBCP != -64 || ks.ConstMethodSize == 0 {
		t.Errorf("kernel state %+v", ks)
	}
	for _, h := range ks.Heaps {
		if h.Low < ks.CodeCache[0] || h.High > ks.CodeCache[1] {
			t.Errorf("heap [%#x, %#x) outside the code cache [%#x, %#x)", h.Low, h.High, ks.CodeCache[0], ks.CodeCache[1])
		}
	}
	t.Logf("JDK %s: %+v", jdk.Name, *ks)
}

// TestNameEverything names every pc with debug info of every nmethod a busier program
// (testdata/SondeMix.java: lambdas, streams, string concatenation, exceptions) leaves in
// the code cache: the JDK's own methods, hidden classes, method handles. Each pc's
// outermost frame must be its nmethod's method, every frame a method of a named class.
func TestNameEverything(t *testing.T) {
	for _, jdk := range testenv.JDKs {
		t.Run(fmt.Sprint(jdk.Major), func(t *testing.T) {
			testenv.RequireRoot(t)
			testenv.RequireJDK(t, jdk)
			dir := t.TempDir()
			if out, err := exec.Command(jdk.Javac(), "-g", "-d", dir, filepath.Join("testdata", "SondeMix.java")).CombinedOutput(); err != nil {
				t.Fatalf("javac: %v\n%s", err, out)
			}
			cmd := exec.Command(jdk.Java(), "-XX:+UseSerialGC", "-Xmx64m", "-XX:-UsePerfData", "-cp", dir, "SondeMix")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cmd.Process.Kill()
				cmd.Wait()
			})
			// Past start-up and into compiling its loop.
			testenv.WaitCPU(t, cmd.Process.Pid, 1500*time.Millisecond)
			p, err := Attach(uint32(cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			n := NewNamer(p, NamerConfig{})
			var nmethods, pcs, frames, inlined int
			var failures []string
			start := time.Now()
			if _, err := p.Blobs(func(b *Blob) bool {
				if !b.NMethod {
					return true
				}
				nmethods++
				d, err := p.ReadDebugInfo(b)
				if err != nil {
					failures = append(failures, err.Error())
					return true
				}
				// The first PcDesc and the last are sentinels (offsets -1 and past the
				// code), not pcs.
				for i, pd := range d.PcDescs {
					if i == 0 || i == len(d.PcDescs)-1 || pd.ScopeOffset == 0 {
						continue
					}
					pcs++
					fs, err := n.Compiled(b.CodeBegin + uint64(pd.PcOffset))
					if err != nil {
						failures = append(failures, err.Error())
						continue
					}
					frames += len(fs)
					for i, f := range fs {
						last := i == len(fs)-1
						if f.Class == "" || f.Name == "" || f.Signature == "" || f.Inlined == last || (last && f.Method != b.Method) {
							t.Errorf("nmethod %d at %#x, pc offset %d: frame %d %+v", b.CompileID, b.Addr, pd.PcOffset, i, f)
						}
						if f.Inlined {
							inlined++
						}
					}
				}
				return true
			}); err != nil {
				t.Logf("code cache walk ended early: %v", err)
			}
			t.Logf("JDK %s: %d nmethods, %d pcs named as %d frames (%d inlined) in %v; %d failures; namer %+v",
				jdk.Name, nmethods, pcs, frames, inlined, time.Since(start).Round(time.Millisecond), len(failures), n.Stats())
			// nmethods flushed while the walk reads them fail to read; nothing else may.
			if nmethods < 50 || pcs < 500 || len(failures) > pcs/100 {
				t.Errorf("%d nmethods, %d pcs, %d failures: %v", nmethods, pcs, len(failures), failures[:min(len(failures), 10)])
			}
		})
	}
}
