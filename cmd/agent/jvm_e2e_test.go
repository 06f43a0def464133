package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/trace"
)

const javaFile = "JvmWorkload.java"

var (
	javaBuild    sync.Once
	javaClasses  string
	javaBuildErr error
)

// javaWorkload compiles testdata/JvmWorkload.java once, for Java 17, which both JDKs run,
// and returns the directory of its classes.
func javaWorkload(t testing.TB) string {
	t.Helper()
	jdk := testenv.JDKs[0]
	testenv.RequireJDK(t, jdk)
	javaBuild.Do(func() {
		dir, err := os.MkdirTemp("", "sonde-java-")
		if err != nil {
			javaBuildErr = err
			return
		}
		os.Chmod(dir, 0o755)
		out, err := exec.Command(jdk.Javac(), "--release", "17", "-g", "-d", dir, filepath.Join("testdata", javaFile)).CombinedOutput()
		if err != nil {
			javaBuildErr = &buildError{err: err, out: out}
			return
		}
		javaClasses = dir
	})
	if javaBuildErr != nil {
		t.Fatalf("javac: %v", javaBuildErr)
	}
	return javaClasses
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + string(e.out) }

// javaSpans returns the line span of each method of the workload: from its declaration
// to the next line holding only its indent and "}".
func javaSpans(t testing.TB) map[string][2]int64 {
	return sourceSpans(t, filepath.Join("testdata", javaFile),
		regexp.MustCompile(`^(\s+)(?:public )?(?:static )?(?:[\w<>\[\]]+) (\w+)\(.*\{$`))
}

// javaFrames lists a sample's Java frames.
func javaFrames(s *trace.Sample) []srcFrame { return framesOfKind(s, "jvm") }

// javaCommand runs the workload in one mode on one JDK with flags, for two minutes.
func javaCommand(t *testing.T, jdk testenv.JDK, mode string, flags ...string) *exec.Cmd {
	t.Helper()
	testenv.RequireJDK(t, jdk)
	return exec.Command(jdk.Java(), append(append([]string{}, flags...), "-cp", javaWorkload(t), "JvmWorkload", mode, "120")...)
}

// profileJavas runs each of cmds (javaCommand's) at once and profiles them with one sonde
// until each has about 500 samples. It returns the samples of the i-th one's main Java
// thread (the launcher names it "java"): the JVM's compiler and collector threads run
// beside it.
func profileJavas(t *testing.T, cmds ...*exec.Cmd) func(t *testing.T, i int) []*trace.Sample {
	t.Helper()
	p := startGroup(t, runtimeWarm, "ready", cmds...).profile(500, "--thread-attributes", "name,id")
	return func(t *testing.T, i int) []*trace.Sample {
		t.Helper()
		var samples []*trace.Sample
		for _, s := range p.samples(i) {
			if s.ThreadName == "java" {
				samples = append(samples, s)
			}
		}
		if n := count(samples); n < 50 {
			t.Fatalf("%d samples of the workload's main thread", n)
		}
		return samples
	}
}

// javaChain tells whether frames hold want (leaf first, from the first of them in the
// sample) as consecutive Java frames of the workload, each with its file and a line within
// its method.
func javaChain(spans map[string][2]int64, fs []srcFrame, want ...string) bool {
	for i, f := range fs {
		if f.name != "JvmWorkload."+want[0] {
			continue
		}
		if len(fs)-i < len(want) {
			return false
		}
		for k, w := range want {
			g, span := fs[i+k], spans[w]
			if g.name != "JvmWorkload."+w || g.file != javaFile || g.line < span[0] || g.line > span[1] {
				return false
			}
		}
		return true
	}
	return false
}

// checkJavaChain checks that at least 95 % of the samples show want (leaf first) as their
// innermost Java frames of the workload, with file and line, and the JVM's native frames
// that called main below them.
func checkJavaChain(t *testing.T, samples []*trace.Sample, want ...string) {
	t.Helper()
	spans := javaSpans(t)
	var n, good int64
	var bad [][]srcFrame
	for _, s := range samples {
		n += s.Count
		fs := javaFrames(s)
		// Code of the JVM's own at the leaf (a stub, a safepoint poll) has no file.
		for len(fs) > 0 && fs[0].file == "" {
			fs = fs[1:]
		}
		ok := len(fs) > 0 && fs[0].name == "JvmWorkload."+want[0] && javaChain(spans, fs, want...) && calledFromJavaMain(s)
		if ok {
			good += s.Count
		} else if len(bad) < 5 {
			bad = append(bad, fs)
		}
	}
	share := float64(good) / float64(n)
	t.Logf("%.3f of %d samples show %s with file and line, above JavaMain", share, n, strings.Join(want, " <- "))
	if share < 0.95 {
		t.Errorf("%.3f of %d samples show %s with file and line above JavaMain, want 0.95; some samples' Java frames: %v",
			share, n, strings.Join(want, " <- "), bad)
	}
}

// calledFromJavaMain tells whether the sample's stack goes on below its last Java frame
// to the launcher's JavaMain: the native walk took over again where Java's frames ended.
func calledFromJavaMain(s *trace.Sample) bool {
	java := -1
	for i, l := range s.Locations {
		if l.KindName() == "jvm" {
			java = i
		}
	}
	if java < 0 {
		return false
	}
	for _, l := range s.Locations[java+1:] {
		if len(l.Lines) > 0 && l.Lines[0].Function == "JavaMain" {
			return true
		}
	}
	return false
}

// TestJavaStacks profiles a Java program on both JDKs as C2 compiles it (inlining), as the
// interpreter runs it (-Xint), and as C1 compiles it (TieredStopAtLevel=1): its chain of
// methods by name, file and line, above the JVM's native frames that called it.
func TestJavaStacks(t *testing.T) {
	testenv.RequireRoot(t)
	variants := []struct {
		name  string
		flags []string
	}{{"c2", nil}, {"interpreted", []string{"-Xint"}}, {"c1", []string{"-XX:TieredStopAtLevel=1"}}}
	var cmds []*exec.Cmd
	for _, jdk := range testenv.JDKs {
		for _, v := range variants {
			cmds = append(cmds, javaCommand(t, jdk, "chain", v.flags...))
		}
	}
	profiled := profileJavas(t, cmds...)
	for j, jdk := range testenv.JDKs {
		t.Run(strconv.Itoa(jdk.Major), func(t *testing.T) {
			for k, v := range variants {
				t.Run(v.name, func(t *testing.T) {
					checkJavaChain(t, profiled(t, j*len(variants)+k), "walrusChecksum", "walrusPost", "walrusSettle", "main")
				})
			}
		})
	}
}

// TestJavaCallsNative profiles Java calling native code: zlib through JNI
// (java.util.zip.Deflater) and System.arraycopy, compiled and interpreted. zlib's frames
// lie above the Deflater's Java frames, which lie above the workload's, in that order.
func TestJavaCallsNative(t *testing.T) {
	testenv.RequireRoot(t)
	variants := []struct {
		name  string
		flags []string
	}{{"compiled", nil}, {"interpreted", []string{"-Xint"}}}
	var cmds []*exec.Cmd
	for _, jdk := range testenv.JDKs {
		for _, v := range variants {
			cmds = append(cmds, javaCommand(t, jdk, "native", v.flags...))
		}
	}
	profiled := profileJavas(t, cmds...)
	for j, jdk := range testenv.JDKs {
		t.Run(strconv.Itoa(jdk.Major), func(t *testing.T) {
			for k, v := range variants {
				t.Run(v.name, func(t *testing.T) { checkJavaCallsNative(t, profiled(t, j*len(variants)+k)) })
			}
		})
	}
}

// checkJavaCallsNative checks the samples of the native mode: at least 95 % of those in
// zlib and of those copying show the workload's chain to JavaMain below the native code.
func checkJavaCallsNative(t *testing.T, samples []*trace.Sample) {
	t.Helper()
	spans := javaSpans(t)
	var n, zlib, good, copies, goodCopies int64
	var bad [][]string
	for _, s := range samples {
		n += s.Count
		fs := javaFrames(s)
		// In the arraycopy stub (C2 calls it without debug info at the call: the
		// caller is named by the nmethod's own method, narwhalLoop, where it inlined
		// narwhalCopy).
		if len(fs) > 0 && strings.HasPrefix(fs[0].name, "[jit] StubRoutines") {
			copies += s.Count
			if (javaChain(spans, fs, "narwhalCopy", "narwhalLoop", "main") || javaChain(spans, fs[1:], "narwhalLoop", "main")) &&
				calledFromJavaMain(s) {
				goodCopies += s.Count
			}
		}
		// Or in the JVM's own copy, from System.arraycopy's native method, while
		// narwhalCopy is interpreted (or not yet compiled, the whole profile long on a
		// busy host). Some of HotSpot's copy routines are assembly without call frame
		// information: the walk must go on from them to the JVM's C++ and the Java
		// frames.
		arraycopy := len(fs) > 0 && fs[0].name == "java.lang.System.arraycopy"
		if jvmCopy(s) || arraycopy {
			copies += s.Count
			if arraycopy && javaChain(spans, fs, "narwhalCopy", "narwhalLoop", "main") && calledFromJavaMain(s) {
				goodCopies += s.Count
			}
		}
		// The leaf in zlib: the Deflater's native method, the Deflater, then the
		// workload, in that order from the leaf.
		if len(s.Locations) == 0 || s.Locations[0].Mapping == nil || !strings.Contains(filepath.Base(s.Locations[0].Mapping.Path), "libz") {
			continue
		}
		zlib += s.Count
		firstJava, deflater := -1, false
		for i, l := range s.Locations {
			if l.KindName() == "jvm" && firstJava < 0 {
				firstJava = i
			}
			for _, ln := range l.Lines {
				deflater = deflater || strings.HasPrefix(ln.Function, "java.util.zip.Deflater.")
			}
		}
		native := firstJava > 0
		for _, l := range s.Locations[:max(firstJava, 0)] {
			native = native && l.KindName() != "jvm"
		}
		if native && deflater && javaChain(spans, fs, "narwhalDeflate", "narwhalLoop", "main") && calledFromJavaMain(s) {
			good += s.Count
		} else if len(bad) < 5 {
			var names []string
			for _, l := range s.Locations {
				if len(l.Lines) > 0 {
					names = append(names, l.Lines[0].Function)
				}
			}
			bad = append(bad, names)
		}
	}
	t.Logf("%d samples: %d in zlib, %d of them through the Deflater from the workload; %d copying, %d of them from narwhalLoop above JavaMain",
		n, zlib, good, copies, goodCopies)
	if zlib < n/4 || float64(good) < 0.95*float64(zlib) {
		t.Errorf("%d of %d samples in zlib, %d of them with the Deflater's and the workload's Java frames below, want 0.95; some: %v",
			zlib, n, good, bad)
	}
	if copies == 0 || float64(goodCopies) < 0.95*float64(copies) {
		t.Errorf("%d samples copying, %d of them from narwhalLoop above JavaMain, want 0.95", copies, goodCopies)
	}
}

// jvmCopy tells whether a sample's leaf, below any kernel frames, is one of HotSpot's
// copy routines in libjvm (_Copy_conjoint_jlongs_atomic and its kin).
func jvmCopy(s *trace.Sample) bool {
	for _, l := range s.Locations {
		if l.KindName() == "kernel" {
			continue
		}
		return l.Mapping != nil && strings.HasPrefix(filepath.Base(l.Mapping.Path), "libjvm") &&
			len(l.Lines) > 0 && strings.HasPrefix(l.Lines[0].Function, "_Copy_")
	}
	return false
}

// TestJavaChurn profiles a program that loads and unloads classes, whose code is freed
// and replaced, and whose call site deoptimizes with each new class: every frame named is
// a method of the program or of the JDK, the workload's at a line within it; what could
// not be named is [jit] and counted.
func TestJavaChurn(t *testing.T) {
	testenv.RequireRoot(t)
	var cmds []*exec.Cmd
	for _, jdk := range testenv.JDKs {
		cmds = append(cmds, javaCommand(t, jdk, "churn"))
	}
	profiled := profileJavas(t, cmds...)
	for j, jdk := range testenv.JDKs {
		t.Run(strconv.Itoa(jdk.Major), func(t *testing.T) {
			samples := profiled(t, j)
			spans := javaSpans(t)
			method := regexp.MustCompile(`^(?:java|jdk|sun)\.[\w$.]+\.[\w$<>]+$|^JvmWorkload(?:\$\w+)?\.([\w$<>]+)$`)
			var n, named, unnamed, stubs int64
			for _, s := range samples {
				n += s.Count
				for _, f := range javaFrames(s) {
					if strings.HasPrefix(f.name, "[jit] StubRoutines") || strings.HasPrefix(f.name, "[jit] vtable") ||
						strings.HasPrefix(f.name, "[jit] itable") {
						stubs += s.Count // the JVM's own code, named by its blob
						continue
					}
					if strings.HasPrefix(f.name, "[jit]") {
						unnamed += s.Count
						continue
					}
					named += s.Count
					m := method.FindStringSubmatch(f.name)
					if m == nil {
						t.Errorf("a frame named %q: no method of the program", f.name)
						continue
					}
					// Constructors and initializers (<init>, <clinit>) have no span of their
					// own here: only their file is checked.
					if strings.HasPrefix(m[1], "<") {
						if f.file != javaFile {
							t.Errorf("%s in %q, want %s", f.name, f.file, javaFile)
						}
						continue
					}
					// Line 0: compiled code without debug info at the pc, named by its method.
					if span, ok := spans[m[1]]; m[1] != "" && f.line != 0 && (!ok || f.line < span[0] || f.line > span[1] || f.file != javaFile) {
						// Lambdas and the loader's inner class have no span of their own.
						if !strings.Contains(f.name, "$1.") && !strings.Contains(f.name, "lambda$") {
							t.Errorf("%s at %s:%d: outside the method's lines %v", f.name, f.file, f.line, span)
						}
					}
				}
			}
			t.Logf("%d samples: %d Java frames named, %d unnamed ([jit]): %.3f; %d frames of stubs", n, named, unnamed,
				float64(unnamed)/float64(max(named+unnamed, 1)), stubs)
			if named == 0 {
				t.Errorf("no Java frame named among %d samples", n)
			}
		})
	}
}

// TestJavaRecord runs java under sonde record, which profiles the JVM from its first
// instruction: the JVM's code cache is set up after the process is first read, and its
// frames are walked once it is.
func TestJavaRecord(t *testing.T) {
	testenv.RequireRoot(t)
	jdk := testenv.JDKs[0]
	testenv.RequireJDK(t, jdk)
	classes := javaWorkload(t)
	out := filepath.Join(t.TempDir(), "r.otlp.pb")
	cmd := exec.Command(sonde(t), "record", "--output", out, "--top", "0", "--",
		jdk.Java(), "-cp", classes, "JvmWorkload", "chain", "4")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sonde record: %v\n%s", err, b)
	}
	profiles, err := otlp.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	spans := javaSpans(t)
	var n, chain, good int64
	for _, p := range profiles {
		for _, s := range p.Samples {
			// The main Java thread's: the launcher's JavaMain runs it.
			main := false
			for _, l := range s.Locations {
				main = main || len(l.Lines) > 0 && l.Lines[0].Function == "JavaMain"
			}
			if !main {
				continue
			}
			n += s.Count
			fs := javaFrames(s)
			for _, f := range fs {
				if f.name == "JvmWorkload.walrusChecksum" {
					chain += s.Count
					break
				}
			}
			if javaChain(spans, fs, "walrusChecksum", "walrusPost", "walrusSettle", "main") && calledFromJavaMain(s) {
				good += s.Count
			}
		}
	}
	t.Logf("%d samples of the main thread, %d in walrusChecksum, %d of them with the whole chain", n, chain, good)
	if chain < n/2 || float64(good) < 0.95*float64(chain) {
		t.Errorf("%d samples of the main thread, %d in walrusChecksum, %d of them with the whole chain: want half and 0.95", n, chain, good)
	}
}

// BenchmarkJavaSample measures the kernel's cost per sample (bpf_stats) of a Java program
// in C2's code, its Java frames walked, beside a native program of about the same depth.
// The goal: within 1.5 times the native cost.
func BenchmarkJavaSample(b *testing.B) {
	testenv.RequireRoot(b)
	ws := []sampleWorkload{{"native", []string{buildWorkload(b, "depth", depthC, "-O2", "-fomit-frame-pointer"), "60", "20"}}}
	for _, jdk := range testenv.JDKs {
		testenv.RequireJDK(b, jdk)
		ws = append(ws, sampleWorkload{"jdk-" + strconv.Itoa(jdk.Major), []string{jdk.Java(), "-cp", javaWorkload(b), "JvmWorkload", "chain", "60"}})
	}
	compareBPFPerSample(b, ws)
}
